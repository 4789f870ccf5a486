"""Pair features for the semantic verifier: lexical and structural signals beside the embeddings.

Pure Python + numpy, no I/O. The trainer (bench/train_verifier.py) and the serving verifier call
the same `pair_features`, so a change here needs a retrained artifact (FEATURES_VERSION).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Hashable
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from itertools import pairwise

import numpy as np

from cache.semantic.unseen import blind, unseen_apart

FEATURES_VERSION = 2

_TOKEN = re.compile(r"\d+(?:[.,]\d+)*|[^\W\d_]+(?:'[^\W\d_]+)?|[^\w\s]", re.UNICODE)
_NUMBER = re.compile(r"\d+(?:[.,]\d+)*")
_NEGATIONS = frozenset(
    {"not", "no", "never", "none", "nobody", "nothing", "neither", "nor", "without", "cannot"}
)
_QWORDS = frozenset({"what", "why", "how", "when", "where", "who", "whom", "which", "whose"})
_STOP = frozenset(
    [
        "a",
        "an",
        "the",
        "is",
        "are",
        "was",
        "were",
        "be",
        "been",
        "being",
        "am",
        "do",
        "does",
        "did",
        "of",
        "to",
        "in",
        "on",
        "at",
        "for",
        "by",
        "with",
        "from",
        "and",
        "or",
        "as",
        "it",
        "its",
        "this",
        "that",
        "these",
        "those",
        "i",
        "you",
        "he",
        "she",
        "we",
        "they",
        "me",
        "my",
        "your",
        "our",
        "their",
        "his",
        "her",
        "can",
        "could",
        "should",
        "would",
        "will",
        "shall",
        "may",
        "might",
        "must",
        "have",
        "has",
        "had",
        "there",
        "here",
        "some",
        "any",
        "into",
        "about",
        "than",
        "then",
        "so",
        "if",
        "but",
        "also",
        "just",
        "very",
    ]
)
_MATH = frozenset("+-*/^=<>%")

N_BASE = 23
N_IDF = 9
N_LEXICAL = N_BASE + N_IDF


class Idf:
    """Inverse document frequencies of (stemmed) content words, from the verifier's training
    texts; stored in the artifact (idf_words, idf_vals). Unknown words count as rare."""

    __slots__ = ("default", "table")

    def __init__(self, words: list[str], vals: np.ndarray, default: float) -> None:
        self.table = dict(zip(words, (float(v) for v in vals), strict=True))
        self.default = float(default)

    @classmethod
    def fit(cls, texts: list[str], min_df: int = 2) -> Idf:
        df: dict[str, int] = {}
        for t in texts:
            for w in text_info(t).stems:
                df[w] = df.get(w, 0) + 1
        n = max(len(texts), 1)
        words = sorted(w for w, c in df.items() if c >= min_df)
        vals = np.asarray([np.log((n + 1) / (df[w] + 1)) + 1.0 for w in words], np.float32)
        return cls(words, vals, float(np.log((n + 1) / (min_df)) + 1.0))

    def arrays(self) -> dict[str, np.ndarray]:
        words = list(self.table)
        return {
            "idf_words": np.asarray(words),
            "idf_vals": np.asarray([self.table[w] for w in words], np.float16),
            "idf_default": np.asarray([self.default], np.float32),
        }

    def __call__(self, w: str) -> float:
        return self.table.get(w, self.default)


def _stem(t: str) -> str:
    """Crude plural/inflection folding so "cars"/"car", "learning"/"learn" match."""
    if len(t) > 5 and t.endswith("ing"):
        return t[:-3]
    if len(t) > 4 and t.endswith("ed"):
        return t[:-2]
    if len(t) > 4 and t.endswith("es"):
        return t[:-2]
    if len(t) > 3 and t.endswith("s") and not t.endswith("ss"):
        return t[:-1]
    return t


_CLOSING = frozenset({"?", ".", "!"})


def _words(tokens: tuple[str, ...]) -> tuple[str, ...]:
    end = len(tokens)
    while end and tokens[end - 1] in _CLOSING:
        end -= 1
    # Case is kept: "Secret123" / "secret123", "CO" / "Co" (carbon monoxide, cobalt) are other
    # questions, and the uncased embedder cannot tell them apart. Only the first word's case is
    # a matter of style ("how do I" / "How do I").
    return (tokens[0].lower(), *tokens[1:end]) if end else ()


def restates(a: TextInfo, b: TextInfo) -> bool:
    """The same words in the same order, spacing, the first letter's case and a closing ?/./!
    aside: the same question asked again. A learned score must not overrule this: the MLP never
    saw such a pair labelled a duplicate (training pairs differ by construction) and scores
    ~0.006."""
    return a.words == b.words


# Prefixes that turn a word into its opposite (safe/unsafe, legal/illegal, possible/impossible,
# honest/dishonest): a pair that differs only so is the opposite question.
# (a hyphenated "non-toxic" is three tokens, and so a different word count: not a minimal pair;
# "inflammable" is the rare false friend, and only costs a hit)
_NEGATING_PREFIXES = ("un", "in", "im", "il", "ir", "dis", "non")


def _opposite(x: str, y: str) -> bool:
    x, y = x.lower(), y.lower()
    short, long = (x, y) if len(x) < len(y) else (y, x)
    return len(short) >= 3 and any(long == p + short for p in _NEGATING_PREFIXES)


# Question words that each ask for one kind of answer: a time, a place, a person, a reason.
# Swapped for one another the question is another ("When did the war begin?" / "Where did the
# war begin?"). Swaps with "what", "which" or "how" are often the same question ("What is the
# best time to visit?" / "When is ..."), so those are left to the learned score.
_DISTINCT_QWORDS = frozenset({"when", "where", "who", "why"})


def _asks_otherwise(x: str, y: str) -> bool:
    return x != y and x in _DISTINCT_QWORDS and y in _DISTINCT_QWORDS


def contradicts(a: TextInfo, b: TextInfo) -> bool:
    """The same words but for one that asks another question: a question word for a time,
    place, person or reason swapped for another ("When was it built?" / "Where was it
    built?"), a word and its prefixed opposite ("safe" / "unsafe"), or one negation more ("Is
    it safe" / "Is it not safe"). The embedding puts such minimal pairs at cosine ~0.97-0.99
    and the learned score near its bar; they are never the same question, so no learned score
    may serve one for the other (restates' counterpart). So too two texts that differ where the
    embedder cannot see: only in accents or invisible characters, or in any span it reads as
    [UNK] (an emoji: "Can my dog eat 🍎?" / "... 🍇?"), which it embeds alike whatever they say."""
    x, y = a.words, b.words
    if x != y and (unseen_apart(a.unseen, b.unseen) or blind(a.text, b.text)):
        return True  # they differ where the embedder cannot see (cache.semantic.unseen)
    if len(x) == len(y):
        diff = [(p, q) for p, q in zip(x, y, strict=True) if p.lower() != q.lower()]
        if len(diff) != 1:
            return False
        p, q = diff[0][0].lower(), diff[0][1].lower()
        return _asks_otherwise(p, q) or _opposite(p, q)
    if abs(len(x) - len(y)) != 1:
        return False
    short, long = (x, y) if len(x) < len(y) else (y, x)
    for i, t in enumerate(long):
        if long[:i] + long[i + 1 :] == short:
            low = t.lower()
            return low in _NEGATIONS or low.endswith("n't")
    return False


@dataclass(frozen=True, slots=True)
class TextInfo:
    """What the features need from one text; computed once per text (cached entries keep it)."""

    tokens: tuple[str, ...]
    lower: tuple[str, ...]
    content: frozenset[str]
    numbers: frozenset[str]
    caps: frozenset[str]
    negated: bool
    qword: str
    ops: frozenset[str]
    chars: int
    stems: frozenset[str] = frozenset()
    seq: tuple[str, ...] = ()  # content stems in order
    qnext: str = ""  # the word after the question word ("how many" vs "how do")
    text: str = ""  # the text itself (the cross-encoder reads it whole)
    words: tuple[str, ...] = ()  # `tokens`, first one lower-cased, without closing ?/./!
    unseen: tuple[str, ...] = ()  # the spans the embedder reads as [UNK] (Embedder.unseen)


def text_info(text: str, unseen: Callable[[str], tuple[str, ...]] | None = None) -> TextInfo:
    """unseen: the embedder's (Embedder.unseen); without it no span counts as unseen (features
    alone, as the trainer computes them)."""
    tokens = tuple(_TOKEN.findall(text))
    lower = tuple(t.lower() for t in tokens)
    negated = any(t in _NEGATIONS or t.endswith("n't") for t in lower)
    # Capitalised tokens that do not start the text or a sentence: names, places, products.
    caps: set[str] = set()
    for i, tok in enumerate(tokens):
        mid_sentence = i > 0 and tokens[i - 1] not in {".", "?", "!"}
        if (tok[:1].isupper() and mid_sentence) or (len(tok) > 1 and tok.isupper()):
            caps.add(tok.lower())
    qword = next((t for t in lower if t in _QWORDS), "")
    seq = tuple(_stem(t) for t in lower if t not in _STOP and t.isalnum())
    qnext = ""
    if qword:
        qi = lower.index(qword)
        qnext = lower[qi + 1] if qi + 1 < len(lower) else ""
    return TextInfo(
        tokens=tokens,
        lower=lower,
        content=frozenset(t for t in lower if t not in _STOP and t.isalnum()),
        numbers=frozenset(_NUMBER.findall(text)),
        caps=frozenset(caps),
        negated=negated,
        qword=qword,
        ops=frozenset(c for c in text if c in _MATH),
        chars=len(text),
        stems=frozenset(seq),
        seq=seq,
        qnext=qnext,
        text=text,
        words=_words(tokens),
        unseen=unseen(text) if unseen is not None else (),
    )


def _jaccard(a: AbstractSet[Hashable], b: AbstractSet[Hashable]) -> float:
    if not a and not b:
        return 1.0
    return len(a & b) / len(a | b)


def _bigrams(seq: tuple[str, ...]) -> set[tuple[str, str]]:
    return set(pairwise(seq))


def _order_disagreement(a: tuple[str, ...], b: tuple[str, ...]) -> float:
    """Share of discordant pairs among content words both texts hold once (Kendall distance)."""
    pos_b: dict[str, int] = {}
    dup: set[str] = set()
    for i, t in enumerate(b):
        if t in pos_b:
            dup.add(t)
        pos_b[t] = i
    seen: set[str] = set()
    seq: list[int] = []
    for t in a:
        if t in pos_b and t not in dup and t not in seen and t not in _STOP and t.isalnum():
            seen.add(t)
            seq.append(pos_b[t])
    n = len(seq)
    if n < 2:
        return 0.0
    discordant = sum(1 for i in range(n) for j in range(i + 1, n) if seq[i] > seq[j])
    return discordant / (n * (n - 1) / 2)


def _positional_match(a: tuple[str, ...], b: tuple[str, ...]) -> float:
    """Share of shared content words whose left neighbour is also the same (local alignment)."""
    left_a = {t: a[i - 1] if i else "" for i, t in enumerate(a)}
    left_b = {t: b[i - 1] if i else "" for i, t in enumerate(b)}
    shared = [t for t in left_a if t in left_b and t not in _STOP and t.isalnum()]
    if not shared:
        return 1.0
    return sum(1 for t in shared if left_a[t] == left_b[t]) / len(shared)


def _position_shift(a: tuple[str, ...], b: tuple[str, ...]) -> float:
    """Mean move of shared content words' relative positions (0 = same places)."""
    pa = {t: i / max(len(a) - 1, 1) for i, t in enumerate(a) if t not in _STOP and t.isalnum()}
    pb = {t: i / max(len(b) - 1, 1) for i, t in enumerate(b) if t not in _STOP and t.isalnum()}
    shared = pa.keys() & pb.keys()
    if not shared:
        return 0.0
    return sum(abs(pa[t] - pb[t]) for t in shared) / len(shared)


def _idf_features(a: TextInfo, b: TextInfo, idf: Idf | None) -> list[float]:
    """What the texts do *not* share, weighted by rarity: "same topic" pairs share the rare
    topic word and differ in another rare one; "same question" pairs differ only in common ones."""
    w = idf if idf is not None else (lambda _t: 1.0)
    sa, sb = a.stems, b.stems
    shared, only_a, only_b = sa & sb, sa - sb, sb - sa
    m_sh = sum(w(t) for t in shared)
    m_a = sum(w(t) for t in only_a)
    m_b = sum(w(t) for t in only_b)
    cov_a = m_sh / (m_sh + m_a) if m_sh + m_a else 1.0
    cov_b = m_sh / (m_sh + m_b) if m_sh + m_b else 1.0
    diff = [w(t) for t in only_a | only_b]
    return [
        m_sh / (m_sh + m_a + m_b) if m_sh + m_a + m_b else 1.0,
        min(cov_a, cov_b),
        max(cov_a, cov_b),
        m_a + m_b,
        max(diff) if diff else 0.0,
        float(sum(1 for x in diff if x > 6.0)),
        float(bool(a.seq) and bool(b.seq) and a.seq[0] == b.seq[0]),
        float(bool(a.seq) and bool(b.seq) and a.seq[-1] == b.seq[-1]),
        float(a.qword == b.qword and a.qnext == b.qnext),
    ]


def pair_features(a: TextInfo, b: TextInfo, idf: Idf | None = None) -> np.ndarray:
    """N_LEXICAL symmetric features of a text pair (order of a and b does not matter)."""
    ca, cb = a.content, b.content
    only_a, only_b = ca - cb, cb - ca
    la, lb = max(len(a.lower), 1), max(len(b.lower), 1)
    num_diff = len(a.numbers ^ b.numbers)
    caps_diff = len(a.caps ^ b.caps)
    order = max(_order_disagreement(a.lower, b.lower), _order_disagreement(b.lower, a.lower))
    feats = [
        _jaccard(set(a.lower), set(b.lower)),
        _jaccard(ca, cb),
        _jaccard(_bigrams(a.lower), _bigrams(b.lower)),
        float(len(only_a) + len(only_b)),
        float(min(len(only_a), len(only_b))),
        float(max(len(only_a), len(only_b))),
        float(num_diff > 0),
        float(num_diff),
        float(bool(a.numbers) or bool(b.numbers)),
        float(caps_diff > 0),
        float(caps_diff),
        _jaccard(a.caps, b.caps),
        float(a.negated != b.negated),
        float(a.qword != b.qword),
        float(bool(a.qword) and bool(b.qword) and a.qword != b.qword),
        float(a.ops != b.ops),
        order,
        _positional_match(a.lower, b.lower),
        _position_shift(a.lower, b.lower),
        min(la, lb) / max(la, lb),
        float(abs(la - lb)),
        float(np.log1p(min(la, lb))),
        float(a.lower == b.lower),
        *_idf_features(a, b, idf),
    ]
    return np.asarray(feats, dtype=np.float32)
