"""Unseen spans (backends/preprocess/unknown.py) with tokenizers other than the packaged MiniLM
one: a WordPiece vocab whose unknown token is not "[UNK]" and that lacks some ASCII characters
(no shortcut may answer for it), and a byte-level BPE with no unknown token (every character
is read, so only the unread tail is a span). Each answer is checked against the tokenizer's
own encoding, so a rule that held only for the packaged vocab fails here."""

from __future__ import annotations

from tokenizers import Tokenizer, models, normalizers, pre_tokenizers

from backends.preprocess.unknown import TAIL, UnknownSpans


def _wordpiece(unk: str = "<unk>") -> Tokenizer:
    vocab = {unk: 0, "[CLS]": 1, "[SEP]": 2}
    for word in ("how", "do", "i", "reset", "my", "password", "?", "dog", "eat"):
        vocab.setdefault(word, len(vocab))
    for c in "abcdefghijklmnopqrstuvwxyz":  # letters only: digits and most punctuation unknown
        vocab.setdefault(c, len(vocab))
        vocab.setdefault("##" + c, len(vocab))
    tok = Tokenizer(models.WordPiece(vocab, unk_token=unk, max_input_chars_per_word=20))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    return tok


def _expected(tok: Tokenizer, text: str, unk: int) -> tuple[str, ...]:
    enc = tok.encode(text)
    return tuple(text[a:b] for i, (a, b) in zip(enc.ids, enc.offsets, strict=True) if i == unk)


def test_a_wordpiece_vocab_with_its_own_unknown_token_and_no_shortcut() -> None:
    tok = _wordpiece()
    spans = UnknownSpans(tok)
    assert spans._risky is None  # not every printable ASCII character is known: no shortcut
    unk = tok.token_to_id("<unk>")
    for text in (
        "How do I reset my password?",
        "How do I reset my password 123?",
        "Can my dog eat 🍎?",
        "Can my dog eat 🍇?",
        "reset#password",
        "a" * 25,  # one word over max_input_chars_per_word: unknown as a whole
    ):
        assert spans.spans(text) == _expected(tok, text, unk), text
    assert spans.spans("How do I reset my password?") == ()
    assert spans.spans("Can my dog eat 🍎?") != spans.spans("Can my dog eat 🍇?")
    assert spans.spans("a" * 25) == ("a" * 25,)


def _byte_level(window: int) -> Tokenizer:
    """A byte-level BPE without merges: one token per byte, no unknown token."""
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    tok = Tokenizer(models.BPE({s: i for i, s in enumerate(sorted(alphabet))}, []))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.enable_truncation(window)
    return tok


def test_a_byte_level_bpe_reads_every_character_and_only_the_tail_is_unseen() -> None:
    tok = _byte_level(64)
    assert tok.model.unk_token is None
    spans = UnknownSpans(tok, window=64)
    assert spans.spans("Can my dog eat 🍎?") == ()  # bytes: the apple and the grape differ
    long = "the same start of a prompt, " * 2 + "then another question"
    out = spans.spans(long)
    assert len(out) == 1 and out[0].startswith(TAIL)
    assert out[0] == TAIL + long[tok.encode(long).offsets[-1][1] :]


def test_a_short_text_of_many_byte_tokens_still_has_its_tail() -> None:
    """Five emoji are 5 characters and 20 byte tokens: over a 16-token window. The shortcut
    for texts shorter than the window took them as read in full (it holds for ASCII only),
    so two such texts that differ past the window were one input with nothing unseen."""
    tok = _byte_level(16)
    spans = UnknownSpans(tok, window=16)
    first, second = "🍎🍎🍎🍎🍎", "🍎🍎🍎🍎🍇"
    assert tok.encode(first).ids == tok.encode(second).ids  # what the model reads is one
    assert tok.encode(first).overflowing
    assert spans.spans(first) and spans.spans(first) != spans.spans(second)
    assert spans.spans(first)[-1].startswith(TAIL)
    assert spans.spans("plain ascii") == ()  # (the shortcut still answers these)
