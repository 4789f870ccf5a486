"""A sidecar stopped during a Redis outage hands its waiting deletes to the next one started on
the host (cache.tiers.delete_journal), as real `latentgate serve` processes on a real Redis.

Before: an invalidation whose delete Redis could not take waited in the process's memory. A
sidecar killed before Redis answered took it with it, and the old entry, still in Redis, was
served to the client who had just deleted it, by every sidecar, until its TTL.
"""

from __future__ import annotations

import signal
import uuid
from collections.abc import Callable
from pathlib import Path

import redis

from tests.integration.cache.conftest import cache_config
from tests.integration.cache.fleet import request, until
from tests.support.servers import GatewayProcess, RedisServer, ServerThread


def test_a_delete_a_killed_sidecar_could_not_send_is_sent_by_the_next_one(
    upstream: ServerThread,
    redis_server: RedisServer,
    processes: Callable[..., GatewayProcess],
    tmp_path: Path,
) -> None:
    cfg = cache_config(upstream.url, redis_server.url, routes=("default",), tiers=["redis"])
    cfg["cache"]["redis"]["journal_dir"] = str(tmp_path / "journal")
    probe = redis.Redis.from_url(redis_server.url)
    path = f"/items/{uuid.uuid4().hex[:8]}"
    a = processes(cfg)
    try:
        assert request(a.url + path)[1]["X-Cache"] == "miss"
        assert request(a.url + path)[1]["X-Cache"] == "hit"
        stored = list(probe.scan_iter(cfg["cache"]["redis"]["key_prefix"] + "e:*"))
        assert len(stored) == 1
        # Redis takes no writes: A's delete (UNLINK) times out, and waits in A
        probe.execute_command("CLIENT", "PAUSE", "60000", "WRITE")
        status, headers, _ = request(a.url + path, "DELETE")
        assert (status, headers["X-Cache"]) == (200, "bypass")
        a.stop(signal.SIGKILL)  # its queued UNLINK goes with its connections
    finally:
        probe.execute_command("CLIENT", "UNPAUSE")
    assert probe.exists(*stored) == 1  # the old answer, still in Redis
    b = processes(cfg)
    until(lambda: probe.exists(*stored) == 0, "B deletes what A could not")
    status, headers, _ = request(b.url + path)
    assert (status, headers["X-Cache"]) == (200, "miss")
    assert "deletes a stopped process left waiting" in b.log()
    journals = list((tmp_path / "journal").glob("undeleted-*.log"))
    assert len(journals) == 1 and journals[0].read_text() == ""  # B's own, emptied
    probe.close()
