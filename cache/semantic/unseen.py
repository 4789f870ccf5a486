"""Differences between two texts that the embedder cannot see, and so no cosine or learned score
may judge: the texts' vectors are the same whatever the difference says.

Two kinds: accents and invisible characters (the uncased embedder reads the text unmarked:
"pêche" / "péché", peach and sin), and spans its tokenizer maps to its unknown token, [UNK] (an
emoji, a whole unspaced Thai or Khmer sentence: "Can my dog eat 🍎?" / "Can my dog eat 🍇?").
features.contradicts leaves such pairs unscored, so that no verifier or learned bar serves one
question the other's answer.
"""

from __future__ import annotations

import unicodedata


def _written(text: str) -> str:
    """Spacing, the first letter's case and a closing ?/./! aside (restates' leeway), in one
    Unicode form (a composed and a decomposed "é" are one letter)."""
    t = unicodedata.normalize("NFC", " ".join(text.split()).rstrip("?.! "))
    return t[:1].lower() + t[1:]


def _unmarked(text: str) -> str:
    """The text as the uncased embedder reads it: accents and invisible format characters (a
    soft hyphen, a zero-width joiner) dropped and compatibility forms folded. Case is kept, as
    the verifier keeps it (features._words)."""
    t = unicodedata.normalize("NFKD", text)
    return "".join(c for c in t if unicodedata.category(c) not in ("Mn", "Cf"))


def blind(a: str, b: str) -> bool:
    """Texts that differ as written but not as the embedder reads them sit at cosine 1.0
    whatever they ask: nothing learned may serve one for the other."""
    wa, wb = _written(a), _written(b)
    return wa != wb and _unmarked(wa) == _unmarked(wb) != ""


def unseen_apart(a: tuple[str, ...], b: tuple[str, ...]) -> bool:
    """The texts' [UNK] spans (Embedder.unseen, in order) differ: what tells the texts apart
    there is nothing the vectors hold, so that the cosine (1.0 when the rest is the same) and
    every score built on it say nothing about it. A span more or fewer counts too ("Can my dog
    eat 🍇?" / "Can my dog eat?"): only a hit is lost."""
    return a != b
