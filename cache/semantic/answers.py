"""Whether two answers agree (their text: cache.semantic.answer_text).

Labels for the error budget compare the answer a semantic hit would serve (the candidate's
stored entry) with a fresh upstream answer to the asked question.

Agreement, per route (`cache.semantic.answer_match`):
- `exact` (default): equal after whitespace normalisation (deterministic calls only);
- `embedding`: the two answers' embeddings reach `answer_cosine`;
- `judge`: a chat model answers a yes/no question (cache.semantic.judge: off the request path;
  an unusable verdict is no label, never a guess).
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable
from typing import Protocol

import numpy as np

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
