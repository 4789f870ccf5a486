"""The answer text of a stored or fresh entry, and whether two answers agree.

Labels for the error budget compare the answer a semantic hit would serve (the candidate's
stored entry) with a fresh upstream answer to the asked question. Only the generated text is
compared: ids, timestamps and usage differ between two calls that mean the same.

Agreement, per route (`cache.semantic.answer_match`):
- `exact` (default): equal after whitespace normalisation (deterministic calls only);
- `embedding`: the two answers' embeddings reach `answer_cosine`;
- `judge`: a configured OpenAI-compatible chat endpoint answers a yes/no question (off the
  request path; an unusable verdict is no label, never a guess).
"""

from __future__ import annotations

import json
import re
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

import aiohttp
import numpy as np

from cache.codec import CacheEntry

_SPACE = re.compile(r"\s+")


def normalise(text: str) -> str:
    return _SPACE.sub(" ", text).strip()


def _choice_text(choice: Any, delta: bool) -> str:
    if not isinstance(choice, dict):
        return ""
    if isinstance(choice.get("text"), str):  # completions
        return str(choice["text"])
    msg = choice.get("delta" if delta else "message")
    if isinstance(msg, dict):
        content = msg.get("content")
        if isinstance(content, str):
            return content
        if isinstance(content, list):  # content parts
            return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return ""


def _events_text(events: list[bytes]) -> str | None:
    parts: list[str] = []
    for event in events:
        for line in event.split(b"\n"):
            if not line.startswith(b"data:"):
                continue
            data = line[5:].strip()
            if not data or data == b"[DONE]":
                continue
            try:
                doc = json.loads(data)
            except (json.JSONDecodeError, UnicodeDecodeError):
                return None
            if isinstance(doc, dict):
                for choice in doc.get("choices") or []:
                    if isinstance(choice, dict) and choice.get("index", 0) == 0:
                        parts.append(_choice_text(choice, delta=True))
    return "".join(parts)


def answer_text(entry: CacheEntry) -> str | None:
    """The generated text of a chat/completions entry (JSON body or SSE events); None when the
    entry is not a successful answer of that shape (no label is taken from it)."""
    if not 200 <= entry.status < 300:
        return None
    if entry.events is not None:
        return _events_text(entry.events)
    if entry.body is None:
        return None
    try:
        doc = json.loads(entry.body)
    except (json.JSONDecodeError, UnicodeDecodeError):
        return None
    if not isinstance(doc, dict) or not isinstance(doc.get("choices"), list) or not doc["choices"]:
        return None
    return _choice_text(doc["choices"][0], delta=False)


class Matcher(Protocol):
    async def agree(self, question: str, stored: str, fresh: str) -> bool | None: ...


class ExactMatch:
    async def agree(self, question: str, stored: str, fresh: str) -> bool | None:
        return normalise(stored) == normalise(fresh)


class EmbeddingMatch:
    def __init__(self, embed: Callable[[str], Awaitable[np.ndarray]], cosine: float) -> None:
        self.embed = embed
        self.cosine = cosine

    async def agree(self, question: str, stored: str, fresh: str) -> bool | None:
        if normalise(stored) == normalise(fresh):
            return True
        a, b = await self.embed(stored), await self.embed(fresh)
        return float(np.dot(a, b)) >= self.cosine


JUDGE_PROMPT = (
    "Question: {q}\n\nAnswer A: {a}\n\nAnswer B: {b}\n\n"
    "Do answers A and B give the same answer to the question? Reply with one word: yes or no."
)


class JudgeMatch:
    """Asks an OpenAI-compatible chat endpoint (e.g. one of the gateway's own backends)."""

    def __init__(
        self, url: str, model: str, headers: dict[str, str] | None = None, timeout: float = 30.0
    ) -> None:
        self.url = url
        self.model = model
        self.headers = dict(headers or {})
        self.timeout = aiohttp.ClientTimeout(total=timeout)

    async def agree(self, question: str, stored: str, fresh: str) -> bool | None:
        if normalise(stored) == normalise(fresh):
            return True
        body = {
            "model": self.model,
            "temperature": 0,
            "max_tokens": 3,
            "messages": [
                {"role": "user", "content": JUDGE_PROMPT.format(q=question, a=stored, b=fresh)}
            ],
        }
        async with (
            aiohttp.ClientSession(timeout=self.timeout) as s,
            s.post(self.url, json=body, headers=self.headers) as r,
        ):
            if r.status != 200:
                return None
            doc = await r.json(content_type=None)
        verdict = _choice_text((doc.get("choices") or [None])[0], delta=False)
        word = normalise(verdict).lower().strip(".!")
        return True if word.startswith("yes") else False if word.startswith("no") else None
