"""The spans of a text that a tokenizer maps to its unknown token ([UNK] in BERT's WordPiece).

A model reads every such span as the same token: "Can my dog eat 🍎?" and "Can my dog eat 🍇?"
are one input to it, and so is any pair of unspaced Thai sentences of one word each. Whoever
compares texts by their embeddings needs to know what the embedding could not see. That
includes what lies past the model's window: two long prompts that share their first 254 tokens
and ask other questions after them are one input too, so the unread tail is a span as well
(the last one, marked with TAIL).
"""

from __future__ import annotations

import re
import unicodedata
from typing import Any

# Whitespace the BERT normaliser keeps as whitespace; the other ASCII control characters it
# deletes, which can join two words into one (and so one over the word-length limit).
_SPACES = " \t\n\r"
_PRINTABLE = "".join(chr(i) for i in range(33, 127))
TAIL = "\u2026"  # marks the span past the model's window: never a span's own first character


class UnknownSpans:
    """`spans(text)`: the unknown-token spans of `text`, in order, as written (NFC). Thread-safe:
    the tokenizer is only read.

    Tokenising costs ~15 us a text; most texts are plain ASCII, which a WordPiece vocab whose
    every printable ASCII character exists both as a word start and as a continuation can never
    map to its unknown token (greedy longest-match always finds at least the one character),
    unless a word is over the model's max_input_chars_per_word. Such texts are answered without
    tokenising; checked against the vocab when built, so another vocab gets no shortcut."""

    __slots__ = ("_cut", "_risky", "_short", "_tok", "_unk")

    def __init__(
        self, tokenizer: Any, max_chars: int | None = None, window: int | None = None
    ) -> None:
        """tokenizer: configured as the model reads (truncating at its window, `window` tokens
        with the special ones, if it has one: an encoding that overflows had an unread tail)."""
        self._tok = tokenizer
        self._cut = max_chars  # the embedder reads only this prefix of a text
        # An ASCII text this short cannot overflow the window: a token covers one character at
        # least, and ASCII characters are never split (two special tokens frame the text).
        self._short = None if window is None else window - 2
        model = tokenizer.model
        unk = getattr(model, "unk_token", None)
        self._unk: int | None = tokenizer.token_to_id(unk) if unk else None
        self._risky: re.Pattern[str] | None = None
        limit = getattr(model, "max_input_chars_per_word", None)
        if self._unk is not None and limit and _ascii_known(tokenizer):
            # In an ASCII text: a control character, or a run of non-spaces longer than the
            # word limit (a word is never longer than the run that holds it).
            printable = re.escape(_PRINTABLE)
            self._risky = re.compile(f"[^{_SPACES}{printable}]|[{printable}]{{{limit + 1}}}")

    def spans(self, text: str) -> tuple[str, ...]:
        tail = ""
        if self._cut is not None and len(text) > self._cut:
            text, tail = text[: self._cut], text[self._cut :]
        # (ASCII only: a byte-level vocab splits other characters into several tokens, so a
        # short text of emoji or CJK can overflow the window; the shortcut once missed that tail)
        short = self._short is None or (text.isascii() and len(text) <= self._short)
        if (
            not tail
            and short
            and (
                self._unk is None  # a byte-level or fully covering vocab: every word is seen
                or (self._risky is not None and text.isascii() and self._risky.search(text) is None)
            )
        ):
            return ()
        enc = self._tok.encode(text)
        out = tuple(
            unicodedata.normalize("NFC", text[a:b])
            for i, (a, b) in zip(enc.ids, enc.offsets, strict=True)
            if i == self._unk
        )
        if enc.overflowing:
            read = [
                b for (_, b), sp in zip(enc.offsets, enc.special_tokens_mask, strict=True) if not sp
            ]
            tail = text[max(read, default=0) :] + tail
        if tail.strip():
            out += (TAIL + unicodedata.normalize("NFC", tail),)
        return out


def _ascii_known(tokenizer: Any) -> bool:
    """Every printable ASCII character, as the normaliser leaves it, is in the vocab both as a
    word and as a continuation piece (WordPiece's prefix, "##")."""
    vocab = tokenizer.get_vocab()
    prefix = getattr(tokenizer.model, "continuing_subword_prefix", None)
    if prefix is None:
        return False
    norm = tokenizer.normalizer
    for c in _PRINTABLE:
        seen = norm.normalize_str(c) if norm is not None else c
        if not seen or any(ch not in vocab or prefix + ch not in vocab for ch in seen):
            return False
    return True
