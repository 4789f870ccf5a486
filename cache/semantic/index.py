"""Per-namespace FAISS inner-product index over L2-normalised vectors, with ids for removal.

Each namespace is one shard: exhaustive up to `flat_max` entries, then HNSW on the CPU (removals
there are tombstones, compacted by a rebuild). The vectors live only in FAISS, compactly
(`quantizer`): "fp16" codes in flat shards (no training needed, ~lossless), 8-bit scalar codes
in HNSW shards, trained on the vectors the shard holds when it switches (the 8-bit range of each
dimension needs data). "fp32" keeps today's full-precision storage. A caller that needs a vector
back (the verifier, replication) gets it decoded from the codes.
With a CUDA device and faiss GPU support, flat shards live on the GPU (fp32); otherwise the CPU,
said in a log line.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

log = logging.getLogger("latentgate.semantic.index")

Quantizer = Literal["fp32", "fp16", "8bit"]
# std::unordered_map node + id array slot of IndexIDMap2, per vector (measured, rounded up)
_IDMAP_BYTES = 48
SQ_MARGIN = 0.1  # widen each trained 8-bit range by this fraction on both sides


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
    n: int = 0  # live vectors
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
        quantizer: Quantizer = "8bit",
    ) -> None:
        self.dim = dim
        self.flat_max = flat_max
        self.hnsw_m = hnsw_m
        self.ef_search = ef_search
        self.quantizer = quantizer
        self._faiss = _faiss()
        # One query at a time: OpenMP fan-out costs more than it saves, and on a busy machine
        # its spinning threads made a 2,500-entry flat search take ~15 ms instead of ~0.2 ms.
        self._faiss.omp_set_num_threads(1)
        self._gpu = gpu_resources(device)
        self.device = "cuda" if self._gpu is not None else "cpu"
        self._shards: dict[str, _Shard] = {}
        self._where: dict[int, str] = {}
        self._vector_bytes = self._estimate_vector_bytes()
        log.info(
            "semantic index: device=%s kind=flat→hnsw at %d entries, vectors %s",
            self.device,
            flat_max,
            quantizer,
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

    def vector_bytes(self) -> int:
        """What one vector costs in the largest shard kind (codes, graph links, id map): the
        per-entry figure the stage's byte bound counts."""
        return self._vector_bytes

    def _estimate_vector_bytes(self) -> int:
        codes = {"fp32": 4, "fp16": 2, "8bit": 1}[self.quantizer] * self.dim
        # HNSW level 0 keeps 2*M links of 4 bytes, upper levels ~1/M of that again, plus
        # the level and offset arrays.
        links = 2 * self.hnsw_m * 4 + self.hnsw_m * 4 // 2 + 12
        flat_codes = 2 * self.dim if self.quantizer == "8bit" else codes
        return max(codes + links, flat_codes) + _IDMAP_BYTES

    def nbytes(self) -> int:
        """Bytes FAISS holds now (codes, links, id maps, tombstones included)."""
        total = 0
        for s in self._shards.values():
            inner = self._faiss.downcast_index(s.index.index)
            ntotal = int(inner.ntotal)
            codes = self._faiss.downcast_index(inner.storage) if s.kind == "hnsw" else inner
            total += ntotal * (int(getattr(codes, "code_size", 4 * self.dim)) + _IDMAP_BYTES)
            if s.kind == "hnsw":
                h = inner.hnsw
                total += int(h.neighbors.size()) * 4 + int(h.levels.size()) * 4
                total += int(h.offsets.size()) * 8
        return total

    def _qtype(self, kind: str) -> Any:
        f = self._faiss
        sq = f.ScalarQuantizer
        if self.quantizer == "fp16" or (self.quantizer == "8bit" and kind == "flat"):
            return sq.QT_fp16
        return sq.QT_8bit

    def _flat(self) -> tuple[Any, str]:
        f = self._faiss
        if self._gpu is not None:
            return f.IndexIDMap2(f.GpuIndexFlatIP(self._gpu, self.dim)), "flat-gpu"
        if self.quantizer == "fp32":
            return f.IndexIDMap2(f.IndexFlatIP(self.dim)), "flat"
        inner = f.IndexScalarQuantizer(self.dim, self._qtype("flat"), f.METRIC_INNER_PRODUCT)
        return f.IndexIDMap2(inner), "flat"

    def _hnsw(self, ids: np.ndarray, vecs: np.ndarray) -> _Shard:
        f = self._faiss
        if self.quantizer == "fp32":
            inner = f.IndexHNSWFlat(self.dim, self.hnsw_m, f.METRIC_INNER_PRODUCT)
        else:
            inner = f.IndexHNSWSQ(
                self.dim, self._qtype("hnsw"), self.hnsw_m, f.METRIC_INNER_PRODUCT
            )
            # The 8-bit range per dimension (a no-op for fp16), from the vectors at hand plus a
            # margin: a later vector outside it is clipped in that dimension.
            storage = f.downcast_index(inner.storage)
            storage.sq.rangestat = f.ScalarQuantizer.RS_minmax
            storage.sq.rangestat_arg = SQ_MARGIN
            inner.train(vecs)
        inner.hnsw.efSearch = self.ef_search
        index = f.IndexIDMap2(inner)
        index.add_with_ids(vecs, ids)
        return _Shard(index, "hnsw", len(ids))

    def _live(self, namespace: str, shard: _Shard) -> tuple[np.ndarray, np.ndarray]:
        """(ids, decoded vectors) of a shard's live entries, each id's latest copy."""
        f = self._faiss
        inner = f.downcast_index(shard.index.index)
        all_ids = f.vector_to_array(shard.index.id_map)
        vecs = inner.reconstruct_n(0, inner.ntotal)
        latest: dict[int, int] = {}
        for i, ident in enumerate(all_ids.tolist()):
            if self._where.get(ident) == namespace and ident not in shard.dead:
                latest[ident] = i
        ids = np.fromiter(latest, dtype=np.int64, count=len(latest))
        rows = np.fromiter(latest.values(), dtype=np.int64, count=len(latest))
        return ids, np.ascontiguousarray(vecs[rows], dtype=np.float32)

    def add(self, namespace: str, ident: int, vector: np.ndarray) -> None:
        if ident in self._where:
            self.remove(ident)
        vec = np.ascontiguousarray(vector, dtype=np.float32).reshape(1, self.dim)
        shard = self._shards.get(namespace)
        if shard is None:
            index, kind = self._flat()
            shard = self._shards[namespace] = _Shard(index, kind)
        # a re-added id's old HNSW copy stays a tombstone: search keeps the first (best) copy
        shard.dead.discard(ident)
        shard.index.add_with_ids(vec, np.asarray([ident], dtype=np.int64))
        shard.n += 1
        self._where[ident] = namespace
        if shard.kind != "hnsw" and shard.n > self.flat_max:
            self._shards[namespace] = self._hnsw(*self._live(namespace, shard))
            log.info("semantic index: a namespace grew past %d entries; now HNSW", self.flat_max)

    def remove(self, ident: int) -> bool:
        namespace = self._where.pop(ident, None)
        if namespace is None:
            return False
        shard = self._shards[namespace]
        shard.n -= 1
        if shard.n <= 0:
            del self._shards[namespace]
        elif shard.kind == "hnsw":
            # HNSW cannot delete: filter at search time and rebuild once a fifth is dead.
            shard.dead.add(ident)
            if len(shard.dead) * 5 > shard.n + len(shard.dead):
                shard.dead.clear()
                self._shards[namespace] = self._hnsw(*self._live(namespace, shard))
        else:
            shard.index.remove_ids(np.asarray([ident], dtype=np.int64))
        return True

    def vector(self, ident: int) -> np.ndarray | None:
        """The stored vector, decoded (within the quantizer's error of what was added)."""
        namespace = self._where.get(ident)
        if namespace is None:
            return None
        out: np.ndarray = self._shards[namespace].index.reconstruct(int(ident))
        return out

    def vectors(self, idents: list[int]) -> np.ndarray:
        return np.stack([self._shards[self._where[i]].index.reconstruct(int(i)) for i in idents])

    def search(self, namespace: str, vector: np.ndarray, k: int) -> list[tuple[int, float]]:
        """Up to k (id, cosine) pairs, best first, from this namespace only."""
        shard = self._shards.get(namespace)
        if shard is None:
            return []
        q = np.ascontiguousarray(vector, dtype=np.float32).reshape(1, self.dim)
        extra = len(shard.dead)
        scores, ids = shard.index.search(q, min(k + extra, shard.n + extra))
        out: list[tuple[int, float]] = []
        seen: set[int] = set()
        for i, s in zip(ids[0].tolist(), scores[0].tolist(), strict=True):
            if i >= 0 and i not in shard.dead and i not in seen:
                seen.add(i)
                out.append((int(i), float(s)))
                if len(out) == k:
                    break
        return out

    def clear(self) -> None:
        self._shards.clear()
        self._where.clear()
