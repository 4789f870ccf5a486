"""L2: Redis through redis-py asyncio (hiredis parser) on a bounded connection pool.

Every operation has a short deadline and goes through a breaker; a Redis that is down, slow or
flapping costs a request at most one op timeout, then nothing while the breaker is open.
redis-py errors are mapped to the CacheError tree here (`map_errors`) and never leave this module.
An outage is logged when it starts and when it ends (`OutageLog`), never once per request; the
failures are counted in `latentgate_cache_redis_errors_total`.

Modes (cache.redis_client): standalone, sentinel (one primary at a time, found by name) and
cluster, where a batch of GETs is one pipeline, purge and stats visit every primary, and an
op that runs out of its deadline has the slot map checked (cache.tiers.redis_slot_map).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from contextlib import asynccontextmanager
from typing import Any

from redis.asyncio import RedisCluster
from redis.exceptions import NoPermissionError, ResponseError

from cache.breaker import CLOSED, OPEN, Breaker
from cache.codec import CacheEntry, decode, encode
from cache.errors import CodecError, TierError, TierTimeout
from cache.metrics import CacheMetrics
from cache.outage import OutageLog
from cache.redis_client import REDIS_ERRORS, connect, stop_task
from cache.settings import RedisSettings
from cache.tiers.delete_journal import open_journal
from cache.tiers.redis_deletes import WaitingDeletes
from cache.tiers.redis_leases import RELEASE, Leases
from cache.tiers.redis_purge_scan import PurgeScans
from cache.tiers.redis_purges import WaitingPurges
from cache.tiers.redis_refusals import refusal
from cache.tiers.redis_slot_map import SlotMapCheck
from cache.tiers.redis_writes import WriteGate
from cache.tiers.undeleted import UndeletedKeys

log = logging.getLogger("latentgate.cache.redis")

Raw = bytes | str | None  # what redis-py hands back for a GET


class RedisTier(WaitingDeletes, Leases, PurgeScans):
    name = "redis"

    def __init__(self, settings: RedisSettings, metrics: CacheMetrics) -> None:
        assert settings.url is not None
        self.settings = settings
        self.prefix = settings.key_prefix + "e:"
        self.lock_prefix = settings.key_prefix + "l:"
        self._op = settings.timeouts.op
        self._metrics = metrics
        self.breaker = Breaker(
            settings.breaker.failures, settings.breaker.open_s, on_change=self._breaker_changed
        )
        # a breaker reads do not reset, for a Redis that stalls writes (cache.tiers.redis_writes)
        self.writes = WriteGate(settings, metrics, self.breaker)
        self.client = connect(
            settings,
            socket_timeout=settings.timeouts.op,
            max_connections=settings.pool.max_connections,
        )
        self.cluster = isinstance(self.client, RedisCluster)
        # A cluster client first learns the slot map (CLUSTER SLOTS, a connection per node):
        # that gets the connect timeout, not a request's op deadline.
        self._mapped = not self.cluster
        self._slot_map = (
            SlotMapCheck(self.client, settings.timeouts.connect * 4)
            if isinstance(self.client, RedisCluster)
            else None
        )
        self._last_error = ""
        self._outage = OutageLog(
            log,
            f"redis ({settings.mode}), breaker open,",
            "latentgate_cache_redis_errors_total",
        )
        # A full Redis (maxmemory reached, maxmemory-policy noeviction), a read-only replica, a
        # failing snapshot or missing replicas (`refusal`) refuses writes and still answers
        # reads: logged once a spell, apart from outages, and no breaker failure.
        self._full = OutageLog(
            log,
            f"redis ({settings.mode}) writes",
            'latentgate_cache_redis_errors_total{kind="OutOfMemoryError"|"ReadOnlyError"|...}',
        )
        self._denied = OutageLog(
            log,
            f"redis ({settings.mode}) ACL",
            'latentgate_cache_redis_errors_total{kind="NoPermissionError"}',
        )
        self._release = self.client.register_script(RELEASE)
        self._tasks: set[asyncio.Task[None]] = set()
        # GETs issued in the same loop iteration go out as one MGET (see _batched_get).
        self._pending: dict[str, list[asyncio.Future[Raw]]] = {}
        # deletes Redis has not taken yet, and who is told once it has (cache.tiers.undeleted)
        self.undeleted = UndeletedKeys(journal=open_journal(settings))
        self.on_late_delete: Callable[[list[str]], Awaitable[None]] | None = None
        self._retrying: asyncio.Task[None] | None = None
        self._retry_s = 0.25  # the breaker, not this, paces the retries while Redis is down
        self._metrics.undeleted.set(len(self.undeleted))  # a stopped process's, if any
        # purges Redis did not take: kept from being read back, retried (cache.tiers.redis_purges)
        self.purges = WaitingPurges(
            self.purge, self.purge_ready, metrics, self._retry_s, journal=self.undeleted
        )

    def resume(self) -> None:
        """Send the deletes and run the purges a stopped process left (its journal), from
        Cache.open, on the running loop."""
        super().resume()
        self.purges.resume()

    def _breaker_changed(self, state: int) -> None:
        self._metrics.breaker_state.set(state)
        # One line when the breaker opens after having been closed and one when it closes
        # again: open ⇄ half-open repeats every open_s during an outage and is not news.
        log.debug("redis breaker is now %s", ("closed", "open", "half-open")[state])
        if state == OPEN:
            self._outage.failed(self._last_error)
        elif state == CLOSED:
            self._outage.ok()

    @asynccontextmanager
    async def _guard(
        self, op: str, deadline_s: float | None = None, write: bool = False
    ) -> AsyncIterator[None]:
        """map_errors + deadline + breaker bookkeeping for one Redis operation. A `write`'s
        failure counts for the write breaker alone (self.writes): several in a row (a miss's
        lease, store and release) opened the tier's breaker too, and stopped reads that work."""
        verdict = False
        try:
            if not self._mapped:
                async with asyncio.timeout(self.settings.timeouts.connect * 4):
                    await self.client.initialize()
                self._mapped = True
            async with asyncio.timeout(deadline_s or self._op):
                yield
            verdict = True
            self.breaker.success()
            if write:
                self.writes.success()
        except TimeoutError as exc:
            verdict = True
            if self._mapped and self._slot_map is not None:
                # a frozen primary: only a failure of redis-py's own has it re-read the map
                self._slot_map.soon()
            self._last_error = f"{op} timed out after {deadline_s or self._op:g}s"
            self._failed(op, "timeout", write)
            raise TierTimeout(f"redis {op} timed out") from exc
        except TierError:
            raise
        except NoPermissionError as exc:
            # An ACL that denies a command the gateway sends (SET, EVALSHA, UNLINK...): a
            # config error, not an outage, and the other commands work. Each miss's read reset
            # the breaker between its denied ones: nothing was ever logged.
            verdict = True
            self._answered(write)
            self._metrics.redis_errors.labels(op, type(exc).__name__).inc()
            self._denied.failed(
                f"{op}: {exc} What needs it does not reach Redis: grant the user every command"
                f" on keys {self.settings.key_prefix}*"
            )
            raise TierError(f"redis {op} denied: {exc}") from exc
        except ResponseError as exc:
            verdict = True
            why = refusal(exc)
            if why is None:
                raise self._outage_error(op, exc, write) from exc
            # Redis answered: it refuses writes (SET, the lease's SET NX) but serves reads. A
            # full one (noeviction): opening the breaker for that stopped the reads too, and
            # every entry other processes stored there went unread while Redis was full. A
            # read-only replica (a primary a failover demoted, which a standalone client keeps
            # talking to), a failing snapshot (MISCONF) or missing replicas (NOREPLICAS): each
            # miss's get answered and its lease and store failed, so the breaker never opened,
            # nothing was logged, and no answer was stored there again.
            self._answered(write)
            kind = type(exc).__name__ if type(exc) is not ResponseError else str(exc).split()[0]
            self._metrics.redis_errors.labels(op, kind).inc()
            self._full.failed(f"{op}: {exc} {why}")
            raise TierError(f"redis {op} refused: {exc}") from exc
        except (*REDIS_ERRORS, Exception) as exc:
            # Exception too: mid-failover redis-py raised AttributeError from a connection torn
            # down under it, and that reached the client as a 500. A client-library fault is an
            # outage like any other.
            verdict = True
            raise self._outage_error(op, exc, write) from exc
        finally:
            if not verdict:
                self.breaker.release()
                if write:
                    self.writes.release()

    def _answered(self, write: bool) -> None:
        """Redis answered (and refused): no outage, and no stall of its writes either."""
        self.breaker.success()
        if write:
            self.writes.success()

    def _outage_error(self, op: str, exc: BaseException, write: bool = False) -> TierError:
        self._last_error = f"{op}: {type(exc).__name__}: {exc}"
        self._failed(op, type(exc).__name__, write)
        return TierError(f"redis {op} failed: {exc}")

    def _failed(self, op: str, kind: str, write: bool = False) -> None:
        self._metrics.redis_errors.labels(op, kind).inc()
        if write:
            # (a half-open probe slot of the tier's breaker it held goes back: a read probes)
            self.breaker.release()
            self.writes.failure(self._last_error)
            return
        self._outage.count()
        self.breaker.failure()

    async def get(self, key: str) -> CacheEntry | None:
        try:
            return await self.get_checked(key)
        except TierError:
            return None

    async def get_checked(self, key: str) -> CacheEntry | None:
        if key in self.undeleted or (self.purges and self.purges.blocks(key)):
            # (before the breaker: no call, so no probe left open)
            return None  # what Redis holds there is what this process deleted or purged
        if not self.breaker.allow():
            raise TierError("redis is marked down (breaker open)")
        data = await self._batched_get(key)
        if data is None:
            return None
        try:
            entry = decode(data if isinstance(data, bytes) else str(data).encode())
        except CodecError as exc:
            log.warning("deleting undecodable redis entry %s: %s", key, exc)
            self._metrics.decode_errors.labels("redis").inc()
            self._spawn(self.delete(key))
            return None
        return entry if entry.expires_at > time.time() else None

    def _batched_get(self, key: str) -> asyncio.Future[Raw]:
        """Join this iteration's MGET: under load one round trip (and one trip through redis-py's
        command machinery, which costs more CPU than Redis itself) serves many lookups."""
        fut: asyncio.Future[Raw] = asyncio.get_running_loop().create_future()
        waiting = self._pending.get(key)
        if waiting is not None:
            waiting.append(fut)
            return fut
        if not self._pending:
            asyncio.get_running_loop().call_soon(self._flush)
        self._pending[key] = [fut]
        return fut

    def _flush(self) -> None:
        batch, self._pending = self._pending, {}
        self._spawn(self._mget(batch))

    async def _mget(self, batch: dict[str, list[asyncio.Future[Raw]]]) -> None:
        keys = list(batch)
        full = [self.prefix + k for k in keys]
        try:
            async with self._guard("get"):
                if self.cluster:
                    values = await self._cluster_get(full)
                else:
                    values = await self.client.mget(full)
        except BaseException as exc:
            # Every waiter gets an answer, whatever went wrong: a lookup must never hang on an
            # unanswered future (cancellation included).
            err = exc if isinstance(exc, TierError) else TierError(f"redis get failed: {exc!r}")
            for futs in batch.values():
                for f in futs:
                    if not f.done():
                        f.set_exception(err)
            if not isinstance(exc, TierError):
                raise
            return
        for k, v in zip(keys, values, strict=True):
            for f in batch[k]:
                if not f.done():
                    f.set_result(v)

    async def _cluster_get(self, full: list[str]) -> list[Raw]:
        """One GET per key in one cluster pipeline (a write per node). Not an MGET per slot:
        while a reshard moves a slot, an MGET of its keys that the move has split between two
        primaries is refused (TRYAGAIN, which redis-py retries past the op deadline) and the
        whole batch failed; a GET is redirected (ASK, MOVED) to where its key is. The keys of a
        batch are in different slots but for a handful, so this costs no extra commands."""
        client: Any = self.client
        try:
            async with client.pipeline(transaction=False) as pipe:
                for k in full:
                    pipe.get(k)
                values: list[Raw] = await pipe.execute()
        except RedisCluster.ERRORS_ALLOW_RETRY:
            # A plain command that meets a dead node has the client re-read the slot map on its
            # next call; a pipeline leaves that to redis-py's retries, which are off. A process
            # whose Redis traffic was lookups (hits; or its breaker's probes, which are always a
            # lookup) kept sending them to a primary a failover had replaced, and never recovered.
            client._initialize = True
            raise
        return values

    async def put(self, key: str, entry: CacheEntry) -> None:
        ttl = int(entry.expires_at - time.time() + 0.999)
        if ttl <= 0 or not self.writes.allow():
            return
        try:
            async with self._guard("set", write=True):
                await self.client.set(self.prefix + key, encode(entry), ex=ttl)
            self._full.ok()
            self._metrics.stores.labels("redis", "ok").inc()
            self._overwritten(key)
        except TierError:
            self._metrics.stores.labels("redis", "error").inc()

    async def stats(self) -> dict[str, object]:
        out: dict[str, object] = {"breaker": ("closed", "open", "half-open")[self.breaker.state]}
        self.writes.report(out)
        try:
            async with self._guard("stats", self.settings.timeouts.admin):
                n = 0
                async for _ in self.client.scan_iter(match=self.prefix + "*", count=1000):
                    n += 1
                used = await self._used_memory()
            out.update(entries=n, bytes=used)
        except TierError as exc:
            out["error"] = str(exc)
        return out

    async def health(self) -> dict[str, object]:
        """For /readyz: one PING (op timeout) unless the breaker is open."""
        breaker = ("closed", "open", "half-open")[self.breaker.state]
        out: dict[str, object] = {"breaker": breaker, "reachable": False}
        self.writes.report(out)
        if not self.breaker.allow():
            # with the failure that opened it: a wrong password or an ACL that denies a command
            # said only "recent operations failed" here, its cause in one log line long gone
            out["error"] = f"breaker open: recent operations failed (last: {self._last_error})"
            return out
        try:
            async with self._guard("ping"):
                await self.client.ping()
            out["reachable"] = True
        except TierError as exc:
            out["error"] = str(exc)
        out["breaker"] = ("closed", "open", "half-open")[self.breaker.state]
        return out

    async def _used_memory(self) -> int:
        if not self.cluster:
            info = await self.client.info("memory")
            return int(info.get("used_memory", 0))
        per_node: Any = await self.client.info("memory", target_nodes=RedisCluster.PRIMARIES)
        return sum(int(i.get("used_memory", 0)) for i in per_node.values())

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def aclose(self) -> None:
        # awaited: a cancel redis-py spent on an UNLINK in flight left the loop running on
        # after the tier closed (a reload's old tier kept deleting and announcing)
        await stop_task(self._retrying)
        await stop_task(self.purges.task)
        if self._slot_map is not None:
            await self._slot_map.aclose()
        self.undeleted.close()  # (its keys stay in the file for the next process)
        for t in list(self._tasks):
            t.cancel()
        for futs in self._pending.values():
            for f in futs:
                f.cancel()
        if self.cluster and getattr(self.client, "_initialize", False):
            # redis-py's aclose() closes nothing while the client is flagged to re-read its slot
            # map (a failed command flags it, as _cluster_get does): the tier's connections to
            # the live nodes stayed open after it closed (a reload's old tier, for good)
            nodes: Any = self.client.nodes_manager  # type: ignore[union-attr]
            await nodes.aclose()
            await nodes.aclose("startup_nodes")
        await self.client.aclose()  # its pool too (cache.redis_client.connect)
