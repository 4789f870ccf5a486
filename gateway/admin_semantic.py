"""Admin endpoint for client feedback on semantic hits: a reported wrong hit tightens that entry.

POST /admin/cache/semantic/wrong-hit {"entry": <X-Cache-Entry>, "score": <X-Cache-Score>}
(bearer-guarded like every /admin route). After it, only a closer match than the reported one
may reuse that entry; other entries are unaffected.
"""

from __future__ import annotations

import json

from aiohttp import web

from cache import SemanticSetup
from gateway.admin import guarded
from gateway.errors import BadRequest, NotFound


def register(app: web.Application, semantic: SemanticSetup) -> None:
    async def wrong_hit(request: web.Request) -> web.Response:
        try:
            doc = json.loads(await request.read())
        except (ValueError, RecursionError):  # JSON, UTF-8, or an integer out of range
            raise BadRequest("the body must be a JSON object") from None
        if not isinstance(doc, dict) or not isinstance(doc.get("entry"), str):
            raise BadRequest("'entry' (the X-Cache-Entry header of the wrong hit) is required")
        score = doc.get("score", 0.0)
        if not isinstance(score, int | float) or isinstance(score, bool):
            raise BadRequest("'score' must be a number (the X-Cache-Score header)")
        if not await semantic.stage.report_wrong(doc["entry"], float(score)):
            raise NotFound("no semantic entry with that key")
        return web.Response(
            status=200, body=b'{"tightened": true}', content_type="application/json"
        )

    app.router.add_post("/admin/cache/semantic/wrong-hit", guarded(wrong_hit))
