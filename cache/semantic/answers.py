"""Whether two answers agree (their text: cache.semantic.answer_text).

Labels for the error budget compare the answer a semantic hit would serve (the candidate's
stored entry) with a fresh upstream answer to the asked question.

Agreement, per route (`cache.semantic.answer_match`):
- `exact` (default): equal after whitespace normalisation (deterministic calls only);
- `embedding`: the two answers' embeddings reach `answer_cosine`;
- `judge`: a configured OpenAI-compatible chat endpoint answers a yes/no question (off the
  request path; an unusable verdict is no label, never a guess).
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable
from typing import Protocol

import aiohttp
import numpy as np

from cache.semantic.answer_text import reply_text

_SPACE = re.compile(r"\s+")


def normalise(text: str) -> str:
    return _SPACE.sub(" ", text).strip()


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
        verdict = reply_text(doc)
        word = normalise(verdict).lower().strip(".!")
        return True if word.startswith("yes") else False if word.startswith("no") else None
