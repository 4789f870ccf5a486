"""Build a redis-py asyncio client for `cache.redis` in any mode: standalone, cluster, sentinel.

One URL names the servers in every mode (`cache.redis.url`, env LATENTGATE_REDIS_URL):
- standalone: `redis://host:6379/0`
- cluster: `redis://host1:7000,host2:7001` (seed nodes; the rest of the cluster is discovered)
- sentinel: `redis://sentinel1:26379,sentinel2:26379/0`, the primary found by
  `cache.redis.sentinel_master` (env LATENTGATE_REDIS_SENTINEL_MASTER)
A password in the URL is the data servers' password (not the sentinels').

No retries inside redis-py: a retry multiplies the time an outage costs a request; the breaker
and the next request's reconnect (cluster: topology refresh; sentinel: a new primary lookup)
recover instead.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any
from urllib.parse import unquote, urlsplit

from redis.asyncio import BlockingConnectionPool, Redis, RedisCluster
from redis.asyncio.cluster import ClusterNode
from redis.asyncio.retry import Retry
from redis.asyncio.sentinel import Sentinel
from redis.backoff import NoBackoff
from redis.exceptions import RedisClusterException, RedisError

from cache.sentinel_pool import SentinelPool
from cache.settings import RedisSettings

log = logging.getLogger("latentgate.cache.redis")

AnyRedis = Redis | RedisCluster
# What a failing Redis raises in any mode (cluster routing errors are not RedisErrors), plus
# RuntimeError: redis-py's cluster client writes to a transport uvloop already closed when a
# node dies mid-command ("unable to perform operation on <TCPTransport closed=True>").
REDIS_ERRORS = (RedisError, RedisClusterException, OSError, RuntimeError)


def parse_hosts(url: str) -> tuple[list[tuple[str, int]], dict[str, Any]]:
    """(host, port) pairs and connection options (password, username, db, ssl) of a URL whose
    netloc may list several comma-separated hosts."""
    parts = urlsplit(url)
    if parts.scheme not in ("redis", "rediss"):
        raise ValueError(f"redis url must start with redis:// or rediss://, not {url!r}")
    netloc = parts.netloc
    opts: dict[str, Any] = {}
    if "@" in netloc:
        auth, netloc = netloc.rsplit("@", 1)
        user, _, password = auth.partition(":")
        if password:
            opts["password"] = unquote(password)
            if user:
                opts["username"] = unquote(user)
        elif user:
            opts["password"] = unquote(user)
    hosts = []
    for item in netloc.split(","):
        host, _, port = item.strip().rpartition(":")
        if not host:
            host, port = port, "6379"
        hosts.append((host.strip("[]"), int(port)))
    db = parts.path.strip("/")
    if db:
        opts["db"] = int(db)
    if parts.scheme == "rediss":
        opts["ssl"] = True
    return hosts, opts


def connect(
    settings: RedisSettings, *, socket_timeout: float | None, max_connections: int
) -> AnyRedis:
    """A client for `settings`; `socket_timeout` bounds one read (None: wait for ever)."""
    assert settings.url is not None
    t = settings.timeouts
    no_retry = Retry(NoBackoff(), 0)
    if settings.mode == "standalone":
        pool = BlockingConnectionPool.from_url(
            settings.url,
            max_connections=max_connections,
            timeout=t.op,  # waiting for a free connection is part of the op's deadline
            socket_timeout=socket_timeout,
            socket_connect_timeout=t.connect,
        )
        standalone = Redis(connection_pool=pool, retry=no_retry)
        # The pool is this client's alone: aclose() closes its sockets too (Redis.from_pool's
        # ownership; without it every closed client leaks its connections).
        standalone.auto_close_connection_pool = True
        return standalone
    hosts, opts = parse_hosts(settings.url)
    if settings.mode == "cluster":
        opts.pop("db", None)  # a cluster has only db 0
        return RedisCluster(
            startup_nodes=[ClusterNode(h, p) for h, p in hosts],
            max_connections=max_connections,
            socket_timeout=socket_timeout,
            socket_connect_timeout=t.connect,
            retry=no_retry,
            **opts,
        )
    sentinel = Sentinel(  # type: ignore[no-untyped-call]
        hosts,
        sentinel_kwargs={"socket_timeout": t.connect, "socket_connect_timeout": t.connect},
        socket_timeout=socket_timeout,
        socket_connect_timeout=t.connect,
    )
    client: Redis = sentinel.master_for(
        settings.sentinel_master,
        # the primary asked for off any op's deadline, and closing it closes its clients of
        # the sentinels (cache.sentinel_pool)
        connection_pool_class=SentinelPool,
        max_connections=max_connections,
        retry=no_retry,
        **opts,
    )
    return client


Command = tuple[str, tuple[Any, ...], dict[str, Any]]  # method name, args, keyword args


async def round_trip(redis: AnyRedis, commands: Sequence[Command]) -> list[Any]:
    """The commands' replies, in order: one pipeline on a standalone or sentinel client; on a
    cluster, plain commands one after another. A plain command that meets a dead node makes
    the client re-read the slot map (and so find the promoted replica); redis-py's cluster
    pipeline kept dialling the dead primary after a failover."""
    if isinstance(redis, RedisCluster):
        return [await getattr(redis, name)(*args, **kw) for name, args, kw in commands]
    async with redis.pipeline(transaction=False) as p:
        for name, args, kw in commands:
            getattr(p, name)(*args, **kw)
        out: list[Any] = await p.execute()
        return out


async def follow(
    redis: AnyRedis,
    step: Callable[[], Awaitable[None]],
    closing: Callable[[], bool],
    failed: Callable[[Exception], None],
) -> None:
    """Run `step` (one blocking XREAD of a stream and what it read) until `closing()`. A failure
    goes to `failed` and the step is retried after a backoff doubling up to 5 s: a stream tail
    (the semantic sync, the purge fan-out) outlives any Redis outage and never ends on one."""
    backoff = 0.1
    while not closing():
        try:
            if isinstance(redis, RedisCluster):
                await redis.initialize()  # a no-op unless the last failure closed it (below)
            await step()
            backoff = 0.1
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # Redis errors and client-library faults: retried, never fatal
            task = asyncio.current_task()
            if closing() or (task is not None and task.cancelling()):
                # redis-py can turn a cancellation mid-read into a connection error:
                # swallowing it here would leave the owner's aclose() waiting for ever.
                raise asyncio.CancelledError from exc
            failed(exc)
            if isinstance(redis, RedisCluster):
                # XREAD has movable keys: redis-py asks COMMAND GETKEYS of the default node it
                # chose when it read the slot map, before its own "re-read the slot map" step,
                # so with that node dead the tail retried it for ever. Closing the client and
                # initialising it again (above) re-reads the map and picks a live default node.
                with contextlib.suppress(*REDIS_ERRORS):
                    await redis.aclose()
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, 5.0)


async def stop_task(task: asyncio.Task[Any] | None, again_s: float = 0.05) -> None:
    """Cancel `task` and wait until it has ended, cancelling it again while it runs on. redis-py's
    asyncio client can let a command that a cancel interrupted finish and return its reply
    (redis/redis-py#2665: it shields connection state), so the cancel is spent: a loop that goes
    on to sleep or to its next command never ends, and a single cancel-then-await in the owner's
    aclose() waited for ever (a shutdown that hung). A task that had ended on an error of its
    own has it logged, not raised: the closer's other steps (its final flush, closing its
    clients) still run."""
    if task is None:
        return
    while not task.done():
        task.cancel()
        await asyncio.wait({task}, timeout=again_s)
    if not task.cancelled() and (exc := task.exception()) is not None:
        log.warning("task %s had ended on an error: %r", task.get_name(), exc)
