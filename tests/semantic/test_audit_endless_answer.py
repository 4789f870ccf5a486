"""A semantic audit asks the upstream again and reads its answer whole to compare it; a replica
answering with an endless body (a bug, a hostile replica) must not be buffered. The read stops
past the route's max_entry_bytes (an answer that big is never stored nor compared on a miss
either), the connection is closed, and the audit is counted as skipped (too_large): no label,
never a wrong one. Before, the audit buffered the whole body (all 256 MiB the replica offers
here; an endless one until the route's timeout) and counted it as "unusable"."""

from __future__ import annotations

import asyncio

from backends import UpstreamRequest, UpstreamResponse
from backends.remote.transports.factory import make_transport
from backends.settings import RemoteBackendSettings
from cache.semantic.answers import ExactMatch
from cache.semantic.budget import BudgetGrid
from cache.semantic.flow_hooks import audit_fetch
from cache.semantic.learn import RouteBudget
from cache.semantic.records import SemanticHit
from cache.semantic.stage import SemanticStage
from cache.semantic.verifier import MlpVerifier
from tests.semantic.test_learn import answer
from tests.support.endless_replica import IN_FLIGHT, EndlessReplica

MAX_ENTRY_BYTES = 1 << 20


class _Raw:
    """The request's protocol sealing the answer (cache.semantic.flow_hooks.Sealer): as is."""

    def seal(self, content_type: str, data: bytes) -> bytes | list[bytes] | None:
        return data


async def test_an_endless_audit_answer_is_skipped_unread_and_never_labelled(
    stage: SemanticStage, verifier: MlpVerifier
) -> None:
    replica = EndlessReplica(200, b"application/json")
    url = await replica.raw.start()
    transport = make_transport(url, RemoteBackendSettings(replicas=[url]))
    grid = BudgetGrid(0.5, verifier.floor, verifier.p_min, min_labels=3)
    metrics = stage.metrics
    budget = RouteBudget("chat", grid, ExactMatch(), stage, metrics, 0.1, scorer=verifier)

    async def compute() -> UpstreamResponse:
        req = UpstreamRequest("POST", "/v1/chat/completions", [], body=b"{}")
        return await transport.send(req)

    try:
        fetch = audit_fetch(compute, _Raw(), "chat", MAX_ENTRY_BYTES)
        budget.audits += 1  # (as should_audit counts it)
        budget.audit(SemanticHit("k0", 0.97, 0.6), "q", answer("a"), fetch)
        await budget.drain()
        assert metrics.audits.labels("chat", "too_large")._value.get() == 1
        assert budget.audit_outcomes == {"too_large": 1}
        for outcome in ("agree", "disagree", "unusable"):
            assert metrics.labels.labels("chat", "audit", outcome)._value.get() == 0
        assert grid.bar().labels == 0  # no label, right or wrong
        await asyncio.wait_for(replica.closed.wait(), 60)
        assert MAX_ENTRY_BYTES < replica.sent < MAX_ENTRY_BYTES + IN_FLIGHT
    finally:
        await transport.aclose()
        await replica.raw.stop()
