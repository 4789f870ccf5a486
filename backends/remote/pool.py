"""Pool: the replicas of one backend (Envoy's cluster) and the policy for sending to them.

send = breaker → hedge → retries → balancer.pick → one attempt on a replica's transport.
Route policy (retries, hedge, timeouts, idempotent) rides on the request; health, outlier
ejection, the breaker and the retry budget are pool state.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time

from backends.base import UpstreamRequest, UpstreamResponse
from backends.errors import AnswerTooLarge, BackendError, RequestBodyError, UpstreamTimeout
from backends.remote.balancer import build_balancer
from backends.remote.breaker import Breaker
from backends.remote.health import HealthChecker, OutlierDetector
from backends.remote.hedge import LatencyWindow, discard, hedge_delay_s, race
from backends.remote.metrics import RemoteMetrics
from backends.remote.replica import Replica
from backends.remote.retry import (
    IDEMPOTENT_METHODS,
    PUSHBACK_HEADER,
    RetryBudget,
    Waits,
    backoff_s,
    retryable_error,
)
from backends.remote.tracked_body import TrackedBody
from backends.remote.transports.factory import make_transport
from backends.settings import ANSWER_CAP, RemoteBackendSettings, RoutePolicy

log = logging.getLogger("latentgate.backends.pool")
_DEFAULT_POLICY = RoutePolicy()


class Pool:
    timing_stage = "upstream"

    def __init__(
        self,
        name: str,
        settings: RemoteBackendSettings,
        metrics: RemoteMetrics | None = None,
        rng: random.Random | None = None,
        answer_cap: int = ANSWER_CAP,
    ) -> None:
        self.name = name
        self.settings = settings
        # What the replicas speak; the gRPC listener passes calls to "grpc" pools unparsed.
        self.wire = settings.wire
        self.metrics = metrics or RemoteMetrics()
        self._rng = rng or random.Random()
        weights = settings.balancer.weights or [1.0] * len(settings.replicas)
        self.replicas = [
            Replica(u, make_transport(u, settings, answer_cap), weight=w)
            for u, w in zip(settings.replicas, weights, strict=True)
        ]
        self.transports = [r.transport for r in self.replicas]
        self._pick_counters = {id(r): self.metrics.picks.labels(name, r.url) for r in self.replicas}
        slow_start = settings.outlier.slow_start_s
        self.balancer = build_balancer(settings.balancer, self.replicas, slow_start)
        self.detector = OutlierDetector(name, self.replicas, settings.outlier, self.metrics)
        self.health = (
            HealthChecker(
                name, self.replicas, settings.health_check, self.metrics, self._on_healthy
            )
            if settings.health_check is not None
            else None
        )
        self.budget = RetryBudget(settings.retry_budget)
        self.breaker = Breaker(
            name,
            settings.breaker,
            self._connections_in_use,
            on_reject=lambda limit: self.metrics.breaker_rejections.labels(name, limit).inc(),
        )
        self.latencies = LatencyWindow()
        self._tasks: list[asyncio.Task[None]] = []
        for r in self.replicas:
            self.metrics.healthy.labels(name, r.url).set(1)
            self.metrics.ejected.labels(name, r.url).set(0)

    # lifecycle ---------------------------------------------------------------------------------
    async def start(self) -> None:
        """Start background checks (the app's cleanup_ctx calls this; aclose stops them)."""
        if self._tasks:
            return
        self._tasks.append(asyncio.create_task(self._sweep_loop(), name=f"{self.name}-outlier"))
        if self.health is not None:
            self._tasks.append(asyncio.create_task(self.health.run(), name=f"{self.name}-health"))

    async def _sweep_loop(self) -> None:
        while True:
            await asyncio.sleep(self.settings.outlier.interval_s)
            self.detector.sweep()

    async def aclose(self) -> None:
        for t in self._tasks:
            t.cancel()
        for t in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await t
        self._tasks.clear()
        for tr in self.transports:
            await tr.aclose()

    def replica_series(self) -> set[tuple[str, str]]:
        """(backend, replica) of every per-replica gauge this pool set."""
        return {(self.name, r.url) for r in self.replicas}

    def drop_series(self, gone: set[tuple[str, str]]) -> None:
        """Remove the gauges of replicas no pool serves any more (a reload dropped them): a
        replica that is gone must not show as healthy. Counters stay: they are history."""
        for labels in gone & self.replica_series():
            for gauge in (self.metrics.healthy, self.metrics.ejected):
                with contextlib.suppress(KeyError):
                    gauge.remove(*labels)

    # send --------------------------------------------------------------------------------------
    async def send(self, request: UpstreamRequest) -> UpstreamResponse:
        policy = request.policy or _DEFAULT_POLICY
        total = policy.timeouts.total or self.settings.timeouts.total
        if request.deadline_s is not None:
            total = min(total, request.deadline_s)
        # the deadline counts from here: time queued for an in-flight slot is part of it
        deadline = time.monotonic() + total
        try:
            await self.breaker.acquire(timeout_s=total)
        except TimeoutError:  # (counted by the breaker: breaker_rejections{limit=queue_deadline})
            raise UpstreamTimeout(
                f"no in-flight slot on {self.name} within the {total:g}s deadline"
            ) from None
        self.budget.request_started()
        on_end = [self.breaker.release, self.budget.request_finished]
        handed_off = False
        try:
            start = time.monotonic()
            resp = await self._send_hedged(request, policy, deadline)
            self.latencies.add(time.monotonic() - start)
            if resp.stream is not None:
                resp.stream = TrackedBody(resp.stream, on_end)
                resp.deadline = deadline
                handed_off = True
            return resp
        finally:
            if not handed_off:
                for cb in on_end:
                    cb()

    def _replayable(self, request: UpstreamRequest, policy: RoutePolicy) -> bool:
        """Only idempotent requests with a body we still hold may be sent twice."""
        idempotent = policy.idempotent
        if idempotent is None:
            idempotent = request.method.upper() in IDEMPOTENT_METHODS
        return idempotent and (request.body is None or isinstance(request.body, bytes))

    async def _send_hedged(
        self, request: UpstreamRequest, policy: RoutePolicy, deadline: float
    ) -> UpstreamResponse:
        replayable = self._replayable(request, policy)
        tried: set[int] = set()
        key = self._affinity_key(request)
        if policy.hedge is None or not replayable or len(self.replicas) < 2:
            return await self._send_with_retries(request, policy, deadline, tried, key, replayable)

        def may_hedge() -> bool:
            if self.budget.try_acquire():
                self.metrics.hedges.labels(self.name, "sent").inc()
                return True
            self.metrics.hedges.labels(self.name, "budget_denied").inc()
            return False

        async def hedge() -> UpstreamResponse:
            try:
                return await self._send_with_retries(request, policy, deadline, tried, key, True)
            finally:
                self.budget.release()

        resp, hedge_won = await race(
            lambda: self._send_with_retries(request, policy, deadline, tried, key, True),
            hedge,
            hedge_delay_s(policy.hedge, self.latencies),
            may_hedge,
        )
        if hedge_won:
            self.metrics.hedges.labels(self.name, "won").inc()
        return resp

    async def _send_with_retries(
        self,
        request: UpstreamRequest,
        policy: RoutePolicy,
        deadline: float,
        tried: set[int],
        key: bytes | None,
        replayable: bool,
    ) -> UpstreamResponse:
        retries = policy.retries
        attempt = 0
        holding = False
        asked = Waits()
        try:
            while True:
                replica = self._pick(tried, key, asked)
                tried.add(id(replica))
                error: BackendError | None = None
                resp: UpstreamResponse | None = None
                try:
                    resp = await self._attempt(replica, request, policy, deadline)
                except BackendError as exc:
                    error = exc
                pushback_ok = True  # gRFC A6: a negative pushback says "do not retry"
                if resp is not None:
                    asked.note(replica, resp.header("retry-after"))
                    pushback_ok = asked.note_pushback(replica, resp.header(PUSHBACK_HEADER))
                elif error is not None:
                    pushback_ok = asked.note_pushback(replica, getattr(error, "pushback_ms", None))
                if holding:
                    self.budget.release()
                    holding = False
                retry = replayable and attempt < retries.max and deadline > time.monotonic()
                retry = retry and pushback_ok
                if error is not None:
                    retry = retry and retryable_error(error)
                elif resp is not None:
                    retry = retry and resp.status in retries.on_status
                if retry:
                    # Back off first: the budget counts a retry only while it is in flight.
                    pause = backoff_s(
                        attempt + 1, retries.backoff_ms, retries.max_backoff_ms, self._rng
                    )
                    ready = self._ready_in(tried, asked)
                    if ready > 0 and ready >= deadline - time.monotonic():
                        # Every replica the retry could go to asked for longer than the client
                        # will wait: this answer (its Retry-After kept) goes back now, not
                        # after the deadline.
                        self.metrics.retries.labels(self.name, "retry_after_past_deadline").inc()
                        retry = False
                    else:
                        pause = max(pause, ready)
                if retry:
                    await asyncio.sleep(min(pause, max(0.0, deadline - time.monotonic())))
                    if not self.budget.try_acquire():
                        self.metrics.retries.labels(self.name, "budget_denied").inc()
                        retry = False
                if not retry:
                    if error is not None:
                        raise error
                    assert resp is not None
                    return resp
                holding = True
                attempt += 1
                self.metrics.retries.labels(self.name, "sent").inc()
                if resp is not None:
                    await discard(resp)
        finally:
            if holding:
                self.budget.release()

    def _ready_in(self, tried: set[int], asked: Waits) -> float:
        """Seconds until some replica the retry may go to is ready for it: 0 while a fresh one
        or one that asked no wait is left, else the shortest wait the others asked for."""
        now = time.monotonic()
        return min(asked.left(r, now) for r in self._candidates(tried, now))

    def _candidates(self, tried: set[int], now: float) -> list[Replica]:
        available = [r for r in self.replicas if r.available(now)]
        fresh = [r for r in available if id(r) not in tried]
        # Panic mode (Envoy's): with nothing healthy left, spread over every replica.
        out = fresh or available or [r for r in self.replicas if not r.ejected(now)]
        return out or self.replicas

    def _pick(self, tried: set[int], key: bytes | None, asked: Waits | None = None) -> Replica:
        now = time.monotonic()
        for r in self.replicas:
            if r.ejected_until and r.ejected_until <= now:
                self.detector.rejoin(r, now)
        candidates = self._candidates(tried, now)
        if asked is not None:  # not back to a replica inside the wait it asked, while others are
            candidates = asked.ready(candidates, now)
        replica = self.balancer.pick(candidates, key, now)
        self._pick_counters[id(replica)].inc()
        return replica

    def _affinity_key(self, request: UpstreamRequest) -> bytes | None:
        b = self.settings.balancer
        if b.policy != "affinity":
            return None
        if b.hash_header is not None:
            lname = b.hash_header.lower()
            for k, v in request.headers:
                if k.lower() == lname:
                    return v.encode()
            return None
        if isinstance(request.body, bytes) and request.body:
            return request.body[: b.hash_body_prefix]
        return request.path_qs.encode()

    async def _attempt(
        self, r: Replica, request: UpstreamRequest, policy: RoutePolicy, deadline: float
    ) -> UpstreamResponse:
        start = time.monotonic()
        remaining = deadline - start
        if remaining <= 0:
            raise UpstreamTimeout(f"{self.name}: the deadline passed before an attempt", r.url)
        first_byte = policy.timeouts.first_byte
        r.outstanding += 1
        try:
            # The transport enforces the remaining deadline itself; a separate timer is only
            # needed for a first-byte bound tighter than that (it costs a timer per request).
            if first_byte is not None and first_byte < remaining:
                async with asyncio.timeout(first_byte):
                    resp = await r.transport.send(
                        request, connect_s=policy.timeouts.connect, deadline_s=remaining
                    )
            else:
                resp = await r.transport.send(
                    request, connect_s=policy.timeouts.connect, deadline_s=remaining
                )
        except TimeoutError as exc:
            r.outstanding -= 1
            self.detector.on_result(r, True, time.monotonic() - start)
            raise UpstreamTimeout(f"{r.url} sent no response in time", r.url) from exc
        except RequestBodyError:  # the client's body failed: says nothing of the replica
            r.outstanding -= 1
            raise
        except AnswerTooLarge:
            # It answered, only too much for this gateway: a client that asks for a huge
            # output must not get the replicas ejected one by one.
            r.outstanding -= 1
            r.reached = True
            self.detector.on_result(r, False, time.monotonic() - start)
            raise
        except BackendError:
            r.outstanding -= 1
            self.detector.on_result(r, True, None)
            raise
        except BaseException:
            r.outstanding -= 1
            # A cancelled hedge loser: its elapsed time is a lower bound on its latency.
            self.detector.on_result(r, False, time.monotonic() - start)
            raise
        r.reached = True
        self.detector.on_result(r, resp.status >= 500, time.monotonic() - start)
        if resp.stream is None:
            r.outstanding -= 1
        else:  # outstanding until the body ends
            resp.stream = TrackedBody(resp.stream, [r.stream_done])
        return resp

    def _on_healthy(self, r: Replica) -> None:
        r.samples = 0
        r.slow_start_from = time.monotonic()

    def _connections_in_use(self) -> int:
        return sum(t.connections_in_use() for t in self.transports)

    # introspection -----------------------------------------------------------------------------
    def ready(self) -> bool:
        """Ready once a replica has answered and is in rotation: a pool never reached is not
        (readiness waits on it only when the config requires this backend)."""
        now = time.monotonic()
        return any(r.reached and r.available(now) for r in self.replicas)

    def describe(self) -> dict[str, object]:
        now = time.monotonic()
        return {
            "kind": "remote",
            "balancer": self.settings.balancer.policy,
            "breaker": {
                "in_flight": self.breaker.in_flight,
                "pending": self.breaker.pending,
                "rejected": dict(self.breaker.rejected),
            },
            "retry_budget": {
                "active": self.budget.active,
                "extra_in_flight": self.budget.extra_in_flight,
            },
            "replicas": [r.describe(now) for r in self.replicas],
        }

    def pool_stats(self) -> dict[str, dict[str, int]]:
        return {t.url: t.pool_stats() for t in self.transports}
