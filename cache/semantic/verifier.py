"""Second stage of a semantic lookup: does the cached answer truly answer the new question?

Nearest neighbours are only candidates. Three verifiers, one per route policy:
- `MlpVerifier` ("features", the default "on"): a small MLP over cosine and lexical/structural
  signals (cache.semantic.features), trained by bench/train_verifier.py; a 105 KB .npz, ~0.2 ms.
- `CrossEncoderVerifier` ("cross-encoder", opt-in): a MiniLM cross-encoder reads the asked and
  the cached question together (cache.semantic.cross_encoder); one ONNX Runtime call over the
  candidates above the cosine floor, off the event loop. Its artifact is trained with
  `python -m bench.train_cross_encoder` and not shipped (docs/benchmarks.md: fewer PAWS false
  hits than the MLP, ~10 ms per verify on a CPU, and it serves some short word-order swaps).
- `CosineVerifier` ("off"): the cosine threshold alone decides.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from cache.semantic.cross_encoder import DEFAULT_ARTIFACT as CE_ARTIFACT
from cache.semantic.cross_encoder import CrossEncoder, read_meta
from cache.semantic.features import (
    FEATURES_VERSION,
    Idf,
    TextInfo,
    contradicts,
    pair_features,
    restates,
)

DEFAULT_ARTIFACT = Path(__file__).with_name("verifier.npz")
COSINE_THRESHOLD = 0.90  # verifier off, no threshold configured


@dataclass(frozen=True, slots=True)
class Decision:
    """index: the chosen candidate or -1 (refused); score: what the decision was based on."""

    index: int
    score: float
    refused: int  # candidates over the cosine floor that the verifier turned down


class Verifier(Protocol):
    name: str
    floor: float  # the cosine a candidate needs to be considered
    p_min: float  # the verifier score it needs to be served (cosine alone: unused)
    # True: too slow for the event loop; the stage runs choose() in a worker thread, and only
    # when some candidate reaches the floor.
    offload: bool

    def choose(
        self,
        query: TextInfo,
        query_vec: np.ndarray,
        cands: Sequence[TextInfo],
        cand_vecs: np.ndarray,
        cand_cos: np.ndarray,
        tighten: Sequence[float] = (),
    ) -> Decision: ...

    def scores(
        self,
        query: TextInfo,
        query_vec: np.ndarray,
        cands: Sequence[TextInfo],
        cand_vecs: np.ndarray,
        cand_cos: np.ndarray,
    ) -> np.ndarray:
        """Each candidate's score (-1 under the cosine floor): what an error budget bars on."""
        ...


class CosineVerifier:
    """No second stage: the best candidate at or above the cosine threshold is served."""

    name = "off"
    p_min = 0.0
    offload = False

    def __init__(self, threshold: float) -> None:
        self.floor = threshold

    def choose(
        self,
        query: TextInfo,
        query_vec: np.ndarray,
        cands: Sequence[TextInfo],
        cand_vecs: np.ndarray,
        cand_cos: np.ndarray,
        tighten: Sequence[float] = (),
    ) -> Decision:
        for i, c in enumerate(cand_cos):
            need = max(self.floor, tighten[i] if i < len(tighten) else 0.0)
            # (cosine alone still never serves a question its minimal opposite's answer)
            if c >= need and not contradicts(query, cands[i]):
                return Decision(i, float(c), i)
        return Decision(-1, float(cand_cos[0]) if len(cand_cos) else 0.0, 0)

    def scores(
        self,
        query: TextInfo,
        query_vec: np.ndarray,
        cands: Sequence[TextInfo],
        cand_vecs: np.ndarray,
        cand_cos: np.ndarray,
    ) -> np.ndarray:
        cos = np.asarray(cand_cos, np.float32)
        other = np.array([contradicts(query, c) for c in cands], dtype=bool)
        return np.where((cos >= self.floor) & ~other, cos, -1.0).astype(np.float32)


class MlpVerifier:
    """Scores candidates over the cosine floor; serves the most probable one over p_min."""

    name = "mlp"
    offload = False

    def __init__(
        self,
        arrays: dict[str, np.ndarray],
        meta: dict[str, Any],
        floor: float | None = None,
        p_min: float | None = None,
    ) -> None:
        if meta.get("features_version") != FEATURES_VERSION:
            raise ValueError(
                f"verifier artifact has features v{meta.get('features_version')}, code has "
                f"v{FEATURES_VERSION}: retrain with `python -m bench.train_verifier`"
            )
        self.meta = meta
        self.w1 = arrays["w1"].astype(np.float32)
        self.b1 = arrays["b1"].astype(np.float32)
        self.w2 = arrays["w2"].astype(np.float32)
        self.b2 = float(arrays["b2"].reshape(-1)[0])
        self.mean = arrays["mean"].astype(np.float32)
        self.inv_std = (1.0 / arrays["std"]).astype(np.float32)
        self.idf: Idf | None = None
        if "idf_words" in arrays:
            self.idf = Idf(
                arrays["idf_words"].tolist(),
                arrays["idf_vals"].astype(np.float32),
                float(arrays["idf_default"].reshape(-1)[0]),
            )
        self.n_inputs = int(self.w1.shape[0])  # a prefix of build_matrix's columns
        self.floor = float(meta["floor"] if floor is None else floor)
        self.p_min = float(meta["p_min"] if p_min is None else p_min)

    @classmethod
    def load(
        cls,
        path: str | Path = DEFAULT_ARTIFACT,
        *,
        floor: float | None = None,
        p_min: float | None = None,
    ) -> MlpVerifier:
        with np.load(path, allow_pickle=False) as z:
            arrays = {k: z[k] for k in z.files if k != "meta"}
            meta = json.loads(str(z["meta"]))
        return cls(arrays, meta, floor, p_min)

    def features(
        self,
        query: TextInfo,
        query_vec: np.ndarray,
        cands: Sequence[TextInfo],
        cand_vecs: np.ndarray,
        cand_cos: np.ndarray,
    ) -> np.ndarray:
        lex = np.stack([pair_features(query, c, self.idf) for c in cands])
        return build_matrix(np.asarray(cand_cos, np.float32), lex, query_vec[None, :], cand_vecs)

    def probabilities(self, x: np.ndarray) -> np.ndarray:
        x = x[:, : self.n_inputs]
        h = np.maximum((x - self.mean) * self.inv_std @ self.w1 + self.b1, 0.0)
        z = h @ self.w2.reshape(-1) + self.b2
        return np.asarray(1.0 / (1.0 + np.exp(-z)), dtype=np.float32)

    def choose(
        self,
        query: TextInfo,
        query_vec: np.ndarray,
        cands: Sequence[TextInfo],
        cand_vecs: np.ndarray,
        cand_cos: np.ndarray,
        tighten: Sequence[float] = (),
    ) -> Decision:
        keep = [i for i, c in enumerate(cand_cos) if c >= self.floor]
        if not keep:
            return Decision(-1, 0.0, 0)
        x = self.features(
            query, query_vec, [cands[i] for i in keep], cand_vecs[keep], np.asarray(cand_cos)[keep]
        )
        prob = restated(self.probabilities(x), query, [cands[i] for i in keep])
        return _pick(prob, keep, self.p_min, tighten)

    def scores(
        self,
        query: TextInfo,
        query_vec: np.ndarray,
        cands: Sequence[TextInfo],
        cand_vecs: np.ndarray,
        cand_cos: np.ndarray,
    ) -> np.ndarray:
        out = np.full(len(cands), -1.0, np.float32)
        keep = [i for i, c in enumerate(cand_cos) if c >= self.floor]
        if keep:
            x = self.features(
                query,
                query_vec,
                [cands[i] for i in keep],
                cand_vecs[keep],
                np.asarray(cand_cos)[keep],
            )
            out[keep] = restated(self.probabilities(x), query, [cands[i] for i in keep])
        return out


def build_matrix(cos: np.ndarray, lex: np.ndarray, u: np.ndarray, v: np.ndarray) -> np.ndarray:
    """[cos, lexical..., u*v, |u-v|] per row; u broadcasts against v's rows."""
    return np.concatenate([cos.reshape(-1, 1), lex, u * v, np.abs(u - v)], axis=1).astype(
        np.float32
    )


def restated(prob: np.ndarray, query: TextInfo, cands: Sequence[TextInfo]) -> np.ndarray:
    """Scores with every candidate that restates the query (features.restates) at 1.0, and
    every one that asks its minimal opposite (features.contradicts) at -1: unscored, as
    CosineVerifier leaves them. A score of 0.0 would still be a score, and a learned bar with a
    cosine-only part (cache.semantic.budget) serves any score at its cosine: the answer to "Is
    it safe ...?" for "Is it not safe ...?". Unscored, no bar serves, labels or joins one."""
    same = [j for j, c in enumerate(cands) if restates(query, c)]
    other = [j for j, c in enumerate(cands) if contradicts(query, c)]
    if not same and not other:
        return prob
    out = np.array(prob, dtype=np.float32, copy=True)
    out[same] = 1.0
    out[other] = -1.0
    return out


def _pick(
    prob: np.ndarray, keep: Sequence[int], p_min: float, tighten: Sequence[float]
) -> Decision:
    """The most probable kept candidate at or over its bar (p_min, or a raised per-entry bar)."""
    best, best_p = -1, 0.0
    for j, i in enumerate(keep):
        need = max(p_min, tighten[i] if i < len(tighten) else 0.0)
        if prob[j] >= need and prob[j] > best_p:
            best, best_p = i, float(prob[j])
    refused = len(keep) - (1 if best >= 0 else 0)
    return Decision(best, best_p if best >= 0 else float(prob.max()), refused)


class CrossEncoderVerifier:
    """Candidates over the cosine floor go to the cross-encoder together; the most probable one
    over p_min is served. The model is attached at start-up (`attach`), after its ONNX build."""

    name = "cross-encoder"
    offload = True

    def __init__(self, artifact: Path, floor: float | None, p_min: float | None) -> None:
        meta = read_meta(artifact)
        self.artifact = artifact
        self.floor = float(meta["floor"] if floor is None else floor)
        self.p_min = float(meta["p_min"] if p_min is None else p_min)
        self.model: CrossEncoder | None = None

    def attach(self, model: CrossEncoder) -> None:
        self.model = model

    def choose(
        self,
        query: TextInfo,
        query_vec: np.ndarray,
        cands: Sequence[TextInfo],
        cand_vecs: np.ndarray,
        cand_cos: np.ndarray,
        tighten: Sequence[float] = (),
    ) -> Decision:
        keep = [i for i, c in enumerate(cand_cos) if c >= self.floor]
        if not keep or self.model is None:
            return Decision(-1, 0.0, len(keep))
        kept = [cands[i] for i in keep]
        prob = self.model.score_pairs_sync([query.text] * len(keep), [c.text for c in kept])
        return _pick(restated(prob, query, kept), keep, self.p_min, tighten)

    def scores(
        self,
        query: TextInfo,
        query_vec: np.ndarray,
        cands: Sequence[TextInfo],
        cand_vecs: np.ndarray,
        cand_cos: np.ndarray,
    ) -> np.ndarray:
        out = np.full(len(cands), -1.0, np.float32)
        keep = [i for i, c in enumerate(cand_cos) if c >= self.floor]
        if keep and self.model is not None:
            kept = [cands[i] for i in keep]
            prob = self.model.score_pairs_sync([query.text] * len(keep), [c.text for c in kept])
            out[keep] = restated(prob, query, kept)
        return out


def with_floor(ver: Verifier, floor: float) -> Verifier:
    """The same verifier scoring from another cosine floor; its serving point is unchanged. A
    shallow copy: it shares the loaded weights (read-only) with the original."""
    out = copy.copy(ver)
    out.floor = floor
    return out


def load_verifier(
    kind: str,
    threshold: float | None,
    min_score: float | None = None,
    artifact: str | Path | None = None,
    cross_encoder_artifact: str | Path | None = None,
) -> Verifier:
    """'on' / 'features' → the MLP; 'cross-encoder' → the cross-encoder; 'off' → cosine alone.
    With a verifier, `threshold` is its cosine floor and `min_score` its acceptance bar; None
    takes the operating point calibrated into its artifact."""
    if kind == "off":
        return CosineVerifier(COSINE_THRESHOLD if threshold is None else threshold)
    if kind == "cross-encoder":
        path = Path(cross_encoder_artifact) if cross_encoder_artifact else CE_ARTIFACT
        if not path.is_file():
            raise FileNotFoundError(
                f"verifier 'cross-encoder' needs its artifact {path}: train it with "
                "`python -m bench.train_cross_encoder` (or set "
                "cache.semantic.cross_encoder_artifact)"
            )
        return CrossEncoderVerifier(path, threshold, min_score)
    return MlpVerifier.load(artifact or DEFAULT_ARTIFACT, floor=threshold, p_min=min_score)
