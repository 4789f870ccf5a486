"""Synthetic word-swap negatives for the verifier: PAWS's failure mode, made from training texts.

"Is the Tabaci a tributary of the Leurda?" and "Is the Leurda a tributary of the Tabaci?" hold
the same words and embed almost identically, but ask different things. PAWS has 1,000 such
training pairs; this makes more from the QQP and STS-B training texts by swapping two names,
two numbers, or the two words around a relation word ("better than", "into"), and
labels each (text, swapped text) pair a non-duplicate. Seeded; training texts only.
"""

from __future__ import annotations

import random
import re

_WORD = re.compile(r"\S+")
# Relation words whose two sides cannot be exchanged without changing the question.
_RELATIONS = ("than", "into", "against", "versus", "vs")
_STRIP = ".,?!;:\"'()"


def _core(tok: str) -> str:
    return tok.strip(_STRIP)


def _swap(toks: list[str], i: int, j: int) -> list[str]:
    """Exchange the cores of tokens i and j, keeping each slot's punctuation."""
    out = list(toks)
    ci, cj = _core(toks[i]), _core(toks[j])
    out[i] = toks[i].replace(ci, cj, 1)
    out[j] = toks[j].replace(cj, ci, 1)
    return out


def swapped(text: str, rng: random.Random) -> str | None:
    """One meaning-changing swap of `text`, or None when it has nothing safe to swap."""
    toks = _WORD.findall(text)
    if len(toks) < 4:
        return None
    names = [
        i
        for i, t in enumerate(toks)
        if i > 0
        and not toks[i - 1].endswith((".", "?", "!"))  # a sentence start is no name
        and _core(t)[:1].isupper()
        and _core(t).isalpha()
        and len(_core(t)) > 1
    ]
    numbers = [i for i, t in enumerate(toks) if _core(t).isdigit()]
    options: list[tuple[int, int]] = []
    for group in (names, numbers):
        options += [
            (a, b)
            for k, a in enumerate(group)
            for b in group[k + 1 :]
            # adjacent names are one name ("Donald Trump"): swapping garbles, not re-asks
            if b > a + 1 and _core(toks[a]).lower() != _core(toks[b]).lower()
        ]
    for k, t in enumerate(toks[1:-1], start=1):
        if t.lower() in _RELATIONS:
            left, right = _core(toks[k - 1]), _core(toks[k + 1])
            words = left.isalpha() and right.isalpha() and min(len(left), len(right)) > 2
            if words and left.lower() != right.lower():
                options.append((k - 1, k + 1))
    if not options:
        return None
    i, j = rng.choice(options)
    out = " ".join(_swap(toks, i, j))
    return out if out != text else None


def swap_pairs(texts: list[str], n: int, seed: int) -> list[tuple[str, str]]:
    """Up to n (text, swapped) pairs from distinct texts."""
    rng = random.Random(seed)
    pool = sorted(set(texts))
    rng.shuffle(pool)
    out: list[tuple[str, str]] = []
    for t in pool:
        s = swapped(t, rng)
        if s is not None:
            out.append((t, s))
            if len(out) >= n:
                break
    return out
