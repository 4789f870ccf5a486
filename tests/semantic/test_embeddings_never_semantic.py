"""An embeddings call is never answered semantically, even on a route whose semantic stage is
on for chat (an OpenAI prefix route): each text's own vector is its answer, so a paraphrase
gets its own. (A route that is only embeddings, or whose backend is a local embedder, may not
turn the stage on at all: tests/integration/test_check_config_semantic.py.)"""

from __future__ import annotations

from collections.abc import Callable

import openai

from tests.conftest import base_config
from tests.support.servers import ServerThread

ASKED = "How do I reset my password?"
PARAPHRASE = "How can I reset my password?"


def test_a_paraphrase_gets_its_own_embedding(
    upstream: ServerThread, start_gateway: Callable[..., ServerThread]
) -> None:
    cfg = base_config(upstream.url)
    cfg["routes"] = [
        {
            "name": "openai",
            "match": {"prefix": "/v1/"},
            "protocol": "openai",
            "backend": "upstream",
            "cache": {"exact": {"enabled": True, "ttl": 60}, "semantic": {"enabled": True}},
        }
    ]
    gw = start_gateway(cfg)
    c = openai.OpenAI(base_url=f"{gw.url}/v1", api_key="sk-a", max_retries=0)

    def embed(text: str) -> tuple[list[float], str]:
        raw = c.embeddings.with_raw_response.create(model="e", input=text)
        return raw.parse().data[0].embedding, raw.headers["x-cache"]

    def chat(text: str) -> str:
        raw = c.chat.completions.with_raw_response.create(
            model="m", messages=[{"role": "user", "content": text}], temperature=0
        )
        return str(raw.headers["x-cache"])

    first, x1 = embed(ASKED)
    own, x2 = embed(PARAPHRASE)
    assert (x1, x2) == ("miss", "miss") and own != first
    assert embed(ASKED) == (first, "hit")
    # the stage is on for this route: the same paraphrase of a chat question is served
    assert (chat(ASKED), chat(PARAPHRASE)) == ("miss", "semantic-hit")
