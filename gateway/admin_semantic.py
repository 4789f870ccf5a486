"""Admin endpoints of the semantic cache: client feedback on hits, and the error budgets.

GET /admin/semantic: per route, the serving bar and, on routes with an error budget, the
labelled error estimate, its upper bound, label and audit counts, and the prior's mixture.

POST /admin/cache/semantic/wrong-hit {"entry": <X-Cache-Entry>, "score": <X-Cache-Score>}
(bearer-guarded like every /admin route). After it, only a closer match than the reported one
may reuse that entry; other entries are unaffected.
"""

from __future__ import annotations

import json
import math
from typing import Any

from aiohttp import web

from cache import SemanticRoute, SemanticSetup
from gateway.admin import guarded, utf8
from gateway.codings import read_body
from gateway.errors import BadRequest, NotFound


def register(app: web.Application, semantic: SemanticSetup) -> None:
    async def wrong_hit(request: web.Request) -> web.Response:
        try:
            doc = json.loads(await read_body(request))
        except (ValueError, RecursionError):  # JSON, UTF-8, or an integer out of range
            raise BadRequest("the body must be a JSON object") from None
        if not isinstance(doc, dict) or not isinstance(doc.get("entry"), str):
            raise BadRequest("'entry' (the X-Cache-Entry header of the wrong hit) is required")
        if not utf8(doc):
            raise BadRequest("the body holds a string that is not valid Unicode")
        score = reported_score(doc.get("score"))
        if not await semantic.stage.report_wrong(doc["entry"], score):
            raise NotFound("no semantic entry with that key")
        return web.Response(
            status=200, body=b'{"tightened": true}', content_type="application/json"
        )

    async def status(request: web.Request) -> web.Response:
        routes = {name: route_status(sr) for name, sr in sorted(semantic.routes.items())}
        return web.json_response({"routes": routes, "entries": len(semantic.stage.entries)})

    app.router.add_post("/admin/cache/semantic/wrong-hit", guarded(wrong_hit))
    app.router.add_get("/admin/semantic", guarded(status))


def reported_score(raw: object) -> float:
    """The wrong hit's X-Cache-Score, as a number or as the header's text. Without one the
    entry stops answering paraphrases altogether (its bar goes over 1.0): a bar raised to
    just over 0 would leave every hit it served still served."""
    if raw is None:
        return 1.0
    if isinstance(raw, bool) or not isinstance(raw, int | float | str):
        raise BadRequest("'score' must be the X-Cache-Score header: a number in [0, 1]")
    try:
        score = float(raw)
    except (ValueError, OverflowError):  # "abc"; an integer too large for a float
        raise BadRequest("'score' must be the X-Cache-Score header: a number in [0, 1]") from None
    if not 0.0 <= score <= 1.0:  # also NaN
        raise BadRequest(f"'score' must be in [0, 1], not {raw!r}")
    return score


def route_status(sr: SemanticRoute) -> dict[str, Any]:
    v = sr.verifier
    out: dict[str, Any] = {
        "verifier": v.name,
        "static_point": {"cosine": v.floor, "score": v.p_min},
        # another stored question this close contests a candidate (cache.semantic.rivals)
        "rival_cosine": sr.policy.rival_cosine,
        "max_error_rate": sr.policy.max_error_rate,
        "pending_flights": len(sr.pending),
    }
    b = sr.budget
    if b is None:
        return out
    out["serving"] = b.serving  # False: a reload turned this route's semantic cache off
    out["scoring_floor"] = b.scorer.floor  # a budgeted route scores and labels from here
    # what its labels mean (scorer, point, rival rule, answer match): the shared counts' key
    out["label_context"] = b.context
    bar = b.bar()
    g = b.grid
    out["budget"] = {
        "bar": {
            "open": bar.open and b.serving,
            "cosine": bar.cosine,
            "score": bar.score,
            "cosine_only": bar.cos_only,
            "closed_reason": bar.reason or None,
        },
        # While closed nothing is served: the figures are the shipped point's region, the one
        # the route starts from, and `closed_reason` says which of them keeps it shut.
        "served_region" if bar.open else "shipped_region": {
            "labels": bar.labels,
            "prior_labels": round(bar.prior_labels, 1),
            "error_estimate": None if math.isnan(bar.estimate) else bar.estimate,
            "error_bound": bar.bound,
        },
        # faded counts (cache.semantic.label_half_life), rounded
        "labels": round(float(g.labels.sum())),
        "wrong": round(float(g.wrong.sum())),
        "lookups_with_a_candidate": round(float(g.volume.sum())),
        "semantic_hits": b.hits,
        "audits": b.audits,
        # this process's, since it started (the counts above are the fleet's, faded)
        "audits_by_outcome": {
            o: b.audit_outcomes[o] for o in ("agree", "disagree", "unusable", "error")
        },
        "labels_by_source": {
            s: {o: b.label_outcomes[s, o] for o in ("agree", "disagree", "unusable", "shed")}
            for s in ("miss", "audit")
        },
        "audit_rate": b.audit_rate,
        "confidence": sr.policy.error_confidence,
        # which development dataset the live labels look like (None: no prior in use)
        "prior": g.mixture() if g.prior is not None else None,
        # its wrong counts scaled by how much more often this route's labels are wrong
        "prior_scale": round(bar.prior_scale, 3),
        # tenants this process serves nothing semantic: their own live labels in the served
        # region refute the bar (cache.semantic.tenant_guard); worst first, ids shortened
        "guarded_tenants": [
            {
                "tenant": v.tenant,
                "labels": round(v.labels, 2),
                "wrong": round(v.wrong, 2),
                "error_lower_bound": round(v.lower_bound, 4),
            }
            for v in (b.guard.guarded(bar) if b.guard is not None else [])
        ],
        "tenant_guard": b.guard is not None,
    }
    return out
