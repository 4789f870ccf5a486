"""`answer_match: judge`: a chat model asked whether two answers say the same.

The judge is one of the gateway's own backends, called directly (never through a route, so a
verdict is never a cached or semantic answer to a similar prompt), or any OpenAI-compatible
URL. It runs off the request path, at most `max_concurrent` verdicts at a time per route (a
slow judge queues labels, never client requests), each bounded by `timeout`. A failed,
refused or unclear verdict is no label (None), never a guess.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp

from backends import BodyTooLarge, UpstreamRequest
from cache.semantic.answer_text import reply_text
from cache.semantic.answers import normalise

# (status, parsed JSON body or None) of one judge call
Post = Callable[[dict[str, Any]], Awaitable[tuple[int, Any]]]
# the backend of that name in the app's current generation (reloads swap them), or None
BackendNamed = Callable[[str], Any]

JUDGE_PROMPT = (
    "Question: {q}\n\nAnswer A: {a}\n\nAnswer B: {b}\n\n"
    "Do answers A and B give the same answer to the question? Reply with one word: yes or no."
)


class JudgeFailed(Exception):
    """The judge gave no verdict: no label."""


# A verdict's answer, at most: a chat completion of a word or two is under 2 KiB, this leaves
# room for a verbose provider's extras. A judge answering more (an endless body, a URL that
# points elsewhere) is cut off there and gives no verdict, rather than being held in memory.
JUDGE_ANSWER_CAP = 256 << 10


async def _capped(resp: aiohttp.ClientResponse) -> bytes:
    """aiohttp's body, up to JUDGE_ANSWER_CAP; past it the connection is closed, not read on."""
    data = bytearray()
    async for chunk in resp.content.iter_any():
        data += chunk
        if len(data) > JUDGE_ANSWER_CAP:
            resp.close()
            raise JudgeFailed(f"the judge's answer is over {JUDGE_ANSWER_CAP} bytes")
    return bytes(data)


def verdict(text: str) -> bool | None:
    """yes / no as the reply's first word ("Yes." counts; "not sure" or "none" do not)."""
    words = text.strip().split(maxsplit=1)
    word = words[0].strip(".,!:;\"'*").lower() if words else ""
    return True if word == "yes" else False if word == "no" else None


class JudgeMatch:
    def __init__(
        self,
        post: Post,
        model: str,
        body: dict[str, Any] | None = None,
        max_concurrent: int = 4,
        close: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        self.post = post
        self.model = model
        self.extra = dict(body or {})
        self._slots = asyncio.Semaphore(max_concurrent)
        self._close = close

    async def agree(self, question: str, stored: str, fresh: str) -> bool | None:
        if normalise(stored) == normalise(fresh):
            return True  # equal answers need no judge
        body: dict[str, Any] = {
            "model": self.model,
            "temperature": 0,
            "max_tokens": 3,
            "messages": [
                {"role": "user", "content": JUDGE_PROMPT.format(q=question, a=stored, b=fresh)}
            ],
            **self.extra,
        }
        # a null in the configured body removes a default (e.g. max_tokens, for a model that
        # takes max_completion_tokens instead)
        body = {k: v for k, v in body.items() if v is not None}
        async with self._slots:
            status, doc = await self.post(body)
        if status != 200:
            raise JudgeFailed(f"the judge answered {status}")  # (logged, throttled, by the label)
        return verdict(reply_text(doc))

    async def aclose(self) -> None:
        if self._close is not None:
            await self._close()


def url_judge(url: str, headers: dict[str, str], timeout: float) -> tuple[Post, Any]:
    """A judge at a URL, over one session for the route's labels (opened on first use)."""
    session: list[aiohttp.ClientSession] = []

    async def post(body: dict[str, Any]) -> tuple[int, Any]:
        if not session:
            session.append(aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout)))
        async with session[0].post(url, json=body, headers=headers) as r:
            if r.status != 200:
                return r.status, None
            return r.status, json.loads(await _capped(r))

    async def close() -> None:
        if session:
            await session.pop().close()

    return post, close


def backend_judge(
    backend_named: BackendNamed, name: str, path: str, headers: dict[str, str], timeout: float
) -> Post:
    """A judge that is one of the gateway's backends: its pool, health checks and retries."""

    async def post(body: dict[str, Any]) -> tuple[int, Any]:
        backend = backend_named(name)
        if backend is None:
            raise JudgeFailed(f"judge backend {name!r} is gone (a reload?)")
        hdrs = list(headers.items())
        if not any(k.lower() == "content-type" for k, _ in hdrs):
            hdrs.append(("Content-Type", "application/json"))
        request = UpstreamRequest("POST", path, hdrs, json.dumps(body).encode(), deadline_s=timeout)
        async with asyncio.timeout(timeout):
            up = await backend.send(request)
            try:
                raw = await up.read_capped(JUDGE_ANSWER_CAP)
            except BodyTooLarge:
                raise JudgeFailed(f"the judge's answer is over {JUDGE_ANSWER_CAP} bytes") from None
        if up.status != 200:
            return up.status, None
        return up.status, json.loads(raw)

    return post
