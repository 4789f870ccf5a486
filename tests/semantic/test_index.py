"""VectorIndex: per-namespace search, removal by id, the flat → HNSW switch, device reporting."""

from __future__ import annotations

import numpy as np

from cache.semantic.index import VectorIndex


def unit(rng: np.random.Generator, n: int, d: int = 32) -> np.ndarray:
    v = rng.normal(size=(n, d)).astype(np.float32)
    return v / np.linalg.norm(v, axis=1, keepdims=True)


def test_search_stays_inside_the_namespace() -> None:
    rng = np.random.default_rng(0)
    v = unit(rng, 4)
    idx = VectorIndex(32, device="cpu")
    idx.add("a", 1, v[0])
    idx.add("b", 2, v[0])
    assert [i for i, _ in idx.search("a", v[0], 5)] == [1]
    assert [i for i, _ in idx.search("b", v[0], 5)] == [2]
    assert idx.search("c", v[0], 5) == []
    assert idx.device == "cpu"


def test_remove_and_readd() -> None:
    rng = np.random.default_rng(1)
    v = unit(rng, 3)
    idx = VectorIndex(32, device="cpu")
    for i in range(3):
        idx.add("ns", i + 10, v[i])
    assert idx.remove(11)
    assert not idx.remove(11)
    assert 11 not in [i for i, _ in idx.search("ns", v[1], 5)]
    idx.add("ns", 10, v[2])  # re-adding an id replaces its vector
    top = idx.search("ns", v[2], 1)
    assert top[0][0] in (10, 12) and abs(top[0][1] - 1.0) < 1e-3  # fp16 codes
    assert len(idx) == 2


def test_grows_into_hnsw_and_still_removes() -> None:
    rng = np.random.default_rng(2)
    v = unit(rng, 300)
    idx = VectorIndex(32, flat_max=100, device="cpu")
    for i in range(300):
        idx.add("ns", i, v[i])
    assert idx.kinds() == {"hnsw": 1}
    assert idx.search("ns", v[7], 1)[0][0] == 7
    idx.remove(7)
    assert 7 not in [i for i, _ in idx.search("ns", v[7], 5)]
    for i in range(100):  # enough removals to trigger a compacting rebuild
        idx.remove(i + 100)
    assert idx.search("ns", v[250], 1)[0][0] == 250
    assert len(idx) == 199


def test_quantized_hnsw_keeps_top1_and_decodes_vectors() -> None:
    """8-bit codes in HNSW: nearest neighbours of slightly perturbed copies are still the
    originals, and a stored vector decodes to within the 8-bit step."""
    rng = np.random.default_rng(3)
    v = unit(rng, 400)
    idx = VectorIndex(32, flat_max=200, device="cpu", quantizer="8bit")
    for i in range(400):
        idx.add("ns", i, v[i])
    assert idx.kinds() == {"hnsw": 1}
    q = v + rng.normal(scale=0.02, size=v.shape).astype(np.float32)
    q /= np.linalg.norm(q, axis=1, keepdims=True)
    agree = sum(idx.search("ns", q[i], 1)[0][0] == i for i in range(400))
    assert agree >= 396
    back = idx.vector(323)  # added after the 8-bit ranges were trained
    assert back is not None and float(np.abs(back - v[323]).max()) < 0.02
    assert idx.nbytes() < 400 * (32 * 4 + 32 * 2 * 4 * 2)  # codes, not floats
    exact = VectorIndex(32, flat_max=50, device="cpu", quantizer="fp32")
    exact.add("ns", 1, v[1])
    assert exact.vector_bytes() > idx.vector_bytes()
