"""Contested neighbourhoods: a candidate is not served when another stored question is close too.

Measured on the development data (docs/benchmarks.md, issue 14, fifth session): when a question
has two or more stored neighbours at cosine >= 0.88, the one the verifier picks is wrong far more
often than when it stands alone (QQP calib, second half of a labelled stream, by every dev label:
8 of 20 against 8 of 145 among the hits the shipped point would serve). Several stored questions
this close mean the neighbourhood holds fine distinctions the embedding does not separate: every
one of them went upstream as a miss, so none was judged the same question as another. Whichever
one a lookup picks, the others are reasons to doubt it; such a lookup goes upstream.
"""

from __future__ import annotations

import numpy as np

# The cosine at which another stored question counts as a rival, chosen on the QQP calib part:
# 0.80-0.88 cut the same wrong hits from a stream (0.90 fewer), and in the pooled protocol
# 0.88 keeps the most right hits of those (at the shipped point, precision 0.957 at recall
# 0.104 against cosine's 0.924; 0.85: 0.955 at 0.101; 0.90: 0.952 at 0.104). It is also where
# a budgeted route starts scoring (LEARN_FLOOR).
RIVAL_COSINE = 0.88


def rivals(cos: np.ndarray, rival: float | None) -> int:
    """How many candidates are at or over the rival cosine (0 with the rule off)."""
    if rival is None or cos.size == 0:
        return 0
    return int((cos >= rival).sum())


def contested(cos: np.ndarray, chosen: int, rival: float | None, outside: int = 0) -> bool:
    """Is candidate `chosen` contested: another candidate, or `outside` questions that are not
    among these candidates (stored ones, for an in-flight candidate), at or over the rival
    cosine?"""
    if rival is None:
        return False
    others = rivals(cos, rival) - int(cos[chosen] >= rival)
    return others + outside > 0
