"""Per-namespace FAISS inner-product index over L2-normalised vectors, with ids for removal.

Each namespace is one shard: exact (IndexFlatIP in an IndexIDMap2) up to `flat_max` entries,
then HNSW on the CPU (removals there are tombstones, compacted by a rebuild). With a CUDA device
and faiss GPU support, flat shards live on the GPU; otherwise the CPU, said in a log line.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

import numpy as np

log = logging.getLogger("latentgate.semantic.index")


def _faiss() -> Any:
    # faiss logs each SIMD build it tries (AVX512, AVX2) as INFO "Could not load library ...
    # ModuleNotFoundError" before loading the one it has: noise that reads like a failure.
    logging.getLogger("faiss.loader").setLevel(logging.WARNING)
    import faiss

    return faiss


def gpu_resources(device: str) -> Any | None:
    """faiss GPU resources when asked for ("auto"/"cuda") and available; None → CPU."""
    if device == "cpu":
        return None
    faiss = _faiss()
    try:
        if not hasattr(faiss, "StandardGpuResources") or faiss.get_num_gpus() < 1:
            raise RuntimeError("faiss has no GPU support or sees no CUDA device")
        return faiss.StandardGpuResources()
    except Exception as exc:  # any faiss/CUDA failure means: use the CPU, visibly
        if device == "cuda":
            log.warning("semantic index: GPU requested but unavailable (%s); using the CPU", exc)
        return None


@dataclass
class _Shard:
    index: Any
    kind: str
    vectors: dict[int, np.ndarray] = field(default_factory=dict)
    dead: set[int] = field(default_factory=set)


class VectorIndex:
    """Namespaced nearest-neighbour search; not thread-safe (one event loop owns it)."""

    def __init__(
        self,
        dim: int,
        *,
        flat_max: int = 20_000,
        hnsw_m: int = 32,
        ef_search: int = 64,
        device: str = "auto",
        lazy: bool = False,
    ) -> None:
        self.dim = dim
        self.flat_max = flat_max
        self.hnsw_m = hnsw_m
        self.ef_search = ef_search
        self._wanted = device
        self._faiss: Any = None
        self._gpu: Any = None
        self.device = "pending"
        self._shards: dict[str, _Shard] = {}
        self._where: dict[int, str] = {}
        if not lazy:
            self.open()

    def open(self) -> None:
        """Import faiss and pick the device (once). Lazy indexes do it off the start-up path:
        the import costs a second or so on a busy 2-core machine, before the listeners open."""
        if self._faiss is not None:
            return
        faiss = _faiss()
        # One query at a time: OpenMP fan-out costs more than it saves, and on a busy machine
        # its spinning threads made a 2,500-entry flat search take ~15 ms instead of ~0.2 ms.
        faiss.omp_set_num_threads(1)
        self._gpu = gpu_resources(self._wanted)
        self.device = "cuda" if self._gpu is not None else "cpu"
        self._faiss = faiss
        log.info(
            "semantic index: device=%s kind=flat→hnsw at %d entries", self.device, self.flat_max
        )

    def __len__(self) -> int:
        return len(self._where)

    def __contains__(self, ident: int) -> bool:
        return ident in self._where

    def kinds(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for s in self._shards.values():
            out[s.kind] = out.get(s.kind, 0) + 1
        return out

    def _flat(self) -> tuple[Any, str]:
        self.open()
        f = self._faiss
        if self._gpu is not None:
            return f.IndexIDMap2(f.GpuIndexFlatIP(self._gpu, self.dim)), "flat-gpu"
        return f.IndexIDMap2(f.IndexFlatIP(self.dim)), "flat"

    def _hnsw(self, vectors: dict[int, np.ndarray]) -> _Shard:
        self.open()
        f = self._faiss
        inner = f.IndexHNSWFlat(self.dim, self.hnsw_m, f.METRIC_INNER_PRODUCT)
        inner.hnsw.efSearch = self.ef_search
        index = f.IndexIDMap2(inner)
        if vectors:
            ids = np.fromiter(vectors, dtype=np.int64, count=len(vectors))
            index.add_with_ids(np.stack(list(vectors.values())), ids)
        log.info("semantic index: a namespace grew past %d entries; now HNSW", self.flat_max)
        return _Shard(index, "hnsw", dict(vectors))

    def add(self, namespace: str, ident: int, vector: np.ndarray) -> None:
        if ident in self._where:
            self.remove(ident)
        vec = np.ascontiguousarray(vector, dtype=np.float32).reshape(1, self.dim)
        shard = self._shards.get(namespace)
        if shard is None:
            index, kind = self._flat()
            shard = self._shards[namespace] = _Shard(index, kind)
        shard.index.add_with_ids(vec, np.asarray([ident], dtype=np.int64))
        shard.vectors[ident] = vec[0]
        self._where[ident] = namespace
        if shard.kind != "hnsw" and len(shard.vectors) > self.flat_max:
            self._shards[namespace] = self._hnsw(shard.vectors)

    def remove(self, ident: int) -> bool:
        namespace = self._where.pop(ident, None)
        if namespace is None:
            return False
        shard = self._shards[namespace]
        shard.vectors.pop(ident, None)
        if shard.kind == "hnsw":
            # HNSW cannot delete: filter at search time and rebuild once a fifth is dead.
            shard.dead.add(ident)
            if len(shard.dead) * 5 > len(shard.vectors) + len(shard.dead):
                self._shards[namespace] = self._hnsw(shard.vectors)
        else:
            shard.index.remove_ids(np.asarray([ident], dtype=np.int64))
        if not shard.vectors:
            del self._shards[namespace]
        return True

    def vector(self, ident: int) -> np.ndarray | None:
        namespace = self._where.get(ident)
        return None if namespace is None else self._shards[namespace].vectors.get(ident)

    def search(self, namespace: str, vector: np.ndarray, k: int) -> list[tuple[int, float]]:
        """Up to k (id, cosine) pairs, best first, from this namespace only."""
        shard = self._shards.get(namespace)
        if shard is None:
            return []
        q = np.ascontiguousarray(vector, dtype=np.float32).reshape(1, self.dim)
        extra = len(shard.dead)
        scores, ids = shard.index.search(q, min(k + extra, len(shard.vectors) + extra))
        out = []
        for i, s in zip(ids[0].tolist(), scores[0].tolist(), strict=True):
            if i >= 0 and i not in shard.dead:
                out.append((int(i), float(s)))
                if len(out) == k:
                    break
        return out

    def clear(self) -> None:
        self._shards.clear()
        self._where.clear()
