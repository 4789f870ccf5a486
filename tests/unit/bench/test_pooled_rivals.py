"""The offline scorer serves as a route does: a contested pick is a miss there too."""

from __future__ import annotations

import numpy as np

from bench.semantic_pooled import Pool, choose_verified
from cache.semantic.rivals import RIVAL_COSINE, contested


def test_choose_verified_applies_the_rival_rule_like_serving() -> None:
    cos = np.asarray(
        [[0.97, 0.89, 0.5], [0.97, 0.80, 0.5], [0.95, 0.94, 0.2], [0.90, 0.5, 0.4]], np.float32
    )
    prob = np.asarray(
        [[0.9, 0.1, 0.0], [0.9, 0.1, 0.0], [0.2, 0.8, 0.0], [0.3, 0.9, 0.9]], np.float32
    )
    cand = np.arange(12).reshape(4, 3)
    pool = Pool([], np.zeros((0, 2)), np.zeros(4, np.int64), cand, cos, np.ones(4, np.int64))
    plain = choose_verified(pool, prob, 0.88, 0.5, rival=None)
    ruled = choose_verified(pool, prob, 0.88, 0.5)
    assert plain.tolist() == [0, 3, 7, -1]  # query 4: its best score is under the floor
    assert ruled.tolist() == [-1, 3, -1, -1]
    for i, pick in enumerate(plain.tolist()):
        if pick >= 0:
            j = pick - 3 * i
            assert (ruled[i] < 0) == contested(cos[i], j, RIVAL_COSINE)
    # A query whose text is an entry's own is the exact cache's hit: no rule applies to it.
    repeat = Pool(pool.entries, pool.entry_vecs, pool.own, cand, cos, pool.label)
    repeat.same = np.asarray([0, -1, -1, -1])
    assert choose_verified(repeat, prob, 0.88, 0.5).tolist() == [0, 3, -1, -1]
