"""Real Redis Cluster and Sentinel set-ups on loopback, from Debian's redis-server and
redis-sentinel, with short failure timeouts so a failover takes seconds, not the default 30 s.

- `RedisClusterServers`: 3 primaries + 3 replicas (`redis-cli --cluster create`), node timeout
  1 s; `url` lists every node, the form `cache.redis.url` takes in cluster mode.
- `RedisSentinelServers`: a primary, its replica and 3 sentinels (quorum 2), down-after 1 s;
  `url` lists the sentinels, the primary's name is `MASTER`.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from tests.support.servers import RedisServer, free_port, wait_port

MASTER = "lgmaster"


def cli(port: int, *args: str, timeout: float = 10) -> str:
    res = subprocess.run(
        ["redis-cli", "-p", str(port), *args], capture_output=True, text=True, timeout=timeout
    )
    return res.stdout


def _wait(cond: Callable[[], bool], what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return
        time.sleep(0.1)
    raise TimeoutError(f"{what} within {timeout}s")


class RedisClusterServers:
    def __init__(self) -> None:
        self.nodes = self._new_nodes()

    @staticmethod
    def _new_nodes() -> list[RedisServer]:
        return [
            RedisServer(
                [
                    "--cluster-enabled",
                    "yes",
                    "--cluster-config-file",
                    "nodes.conf",
                    "--cluster-node-timeout",
                    "1000",
                    "--cluster-port",
                    str(free_port()),
                    # a replica may take over however long it was cut off (no data-age veto)
                    "--cluster-replica-validity-factor",
                    "0",
                ]
            )
            for _ in range(6)
        ]

    @property
    def url(self) -> str:
        return "redis://" + ",".join(f"127.0.0.1:{n.port}" for n in self.live())

    def live(self) -> list[RedisServer]:
        return [n for n in self.nodes if n.proc is not None and n.proc.poll() is None]

    def start(self) -> RedisClusterServers:
        # free_port() ports are only free when picked: a node whose bus port an outgoing
        # connection took meanwhile exits at start, and `--cluster create` then fails (seen
        # once in a full CI run). Fresh ports and a second try, with the tool's output if not.
        failure = ""
        for _ in range(3):
            try:
                for n in self.nodes:
                    n.start()
            except TimeoutError as exc:
                failure = f"a node did not start: {exc}"
                self.stop()
                self.nodes = self._new_nodes()
                continue
            res = subprocess.run(
                [
                    "redis-cli",
                    "--cluster",
                    "create",
                    *(f"127.0.0.1:{n.port}" for n in self.nodes),
                    "--cluster-replicas",
                    "1",
                    "--cluster-yes",
                ],
                capture_output=True,
                text=True,
                timeout=60,
            )
            if res.returncode == 0:
                _wait(self._healthy, "the cluster did not become healthy")
                return self
            failure = res.stdout[-2000:] + res.stderr[-2000:]
            self.stop()
            self.nodes = self._new_nodes()
        raise RuntimeError(f"the cluster did not form in three tries:\n{failure}")

    def _healthy(self) -> bool:
        live = self.live()
        if not all("cluster_state:ok" in cli(n.port, "cluster", "info") for n in live):
            return False
        return len(self.primaries()) == 3 and len(self.replicas()) == len(live) - 3

    def _roles(self, role: str) -> list[RedisServer]:
        out = []
        for n in self.live():
            info = cli(n.port, "info", "replication")
            if f"role:{role}" in info:
                out.append(n)
        return out

    def primaries(self) -> list[RedisServer]:
        return self._roles("master")

    def replicas(self) -> list[RedisServer]:
        return self._roles("slave")

    def primary_of(self, key: str) -> RedisServer:
        return self.primary_of_slot(
            int(cli(self.live()[0].port, "cluster", "keyslot", key).strip())
        )

    def primary_of_slot(self, slot: int) -> RedisServer:
        for n in self.primaries():
            for line in cli(n.port, "cluster", "nodes").splitlines():
                f = line.split()
                if "myself" in f[2] and "master" in f[2]:
                    for rng in f[8:]:
                        lo, _, hi = rng.partition("-")
                        if lo.isdigit() and int(lo) <= slot <= int(hi or lo):
                            return n
        raise LookupError(f"no primary serves slot {slot}")

    def wait_failover(self, timeout: float = 90.0) -> None:
        """Every slot served again by a live primary after one was killed. (Patience, not a
        bound on anything of ours: a replica whose election fails waits twice the node timeout
        before it tries again, and a loaded machine saw one fail over in more than 30 s.)"""
        _wait(
            lambda: (
                len(self.primaries()) == 3
                and all("cluster_state:ok" in cli(n.port, "cluster", "info") for n in self.live())
            ),
            "no failover",
            timeout,
        )

    def stop(self) -> None:
        for n in self.nodes:
            n.stop()


class RedisSentinelServers:
    def __init__(self) -> None:
        self.primary = RedisServer()
        self.replica: RedisServer | None = None
        self.sentinels: list[tuple[int, subprocess.Popen[bytes], str]] = []
        exe = shutil.which("redis-sentinel")
        if exe is None:
            raise RuntimeError("redis-sentinel not found: `make test` installs it (Debian's)")
        self.exe = exe

    @property
    def url(self) -> str:
        return "redis://" + ",".join(f"127.0.0.1:{p}" for p, _, _ in self.sentinels)

    def start(self) -> RedisSentinelServers:
        self.primary.start()
        replica = RedisServer(["--replicaof", "127.0.0.1", str(self.primary.port)]).start()
        self.replica = replica
        _wait(
            lambda: "master_link_status:up" in cli(replica.port, "info", "replication"),
            "the replica did not sync",
        )
        for _ in range(3):
            port = free_port()
            d = tempfile.mkdtemp(prefix="lg-sentinel-")
            conf = Path(d) / "sentinel.conf"
            conf.write_text(
                f"port {port}\nbind 127.0.0.1\nprotected-mode no\ndir {d}\n"
                f"sentinel monitor {MASTER} 127.0.0.1 {self.primary.port} 2\n"
                f"sentinel down-after-milliseconds {MASTER} 1000\n"
                f"sentinel failover-timeout {MASTER} 5000\n"
                f"sentinel parallel-syncs {MASTER} 1\n"
            )
            proc = subprocess.Popen(
                [self.exe, str(conf)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
            )
            wait_port("127.0.0.1", port)
            self.sentinels.append((port, proc, d))
        _wait(self._known, "the sentinels did not find each other and the replica")
        return self

    def _known(self) -> bool:
        for port, _, _ in self.sentinels:
            out = cli(port, "sentinel", "master", MASTER).split()
            fields = dict(zip(out[::2], out[1::2], strict=False))
            if fields.get("num-slaves") != "1" or fields.get("num-other-sentinels") != "2":
                return False
        return True

    def master_port(self) -> int:
        out = cli(self.sentinels[0][0], "sentinel", "get-master-addr-by-name", MASTER).split()
        return int(out[1])

    def kill_primary(self) -> RedisServer:
        """Kill whichever server is the primary now; returns it."""
        port = self.master_port()
        victim = self.primary if self.primary.port == port else self.replica
        assert victim is not None
        victim.kill()
        return victim

    def wait_failover(self, old_port: int, timeout: float = 30.0) -> None:
        _wait(lambda: self.master_port() != old_port, "no sentinel failover", timeout)

    def stop(self) -> None:
        for _, proc, d in self.sentinels:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)
            shutil.rmtree(d, ignore_errors=True)
        for s in (self.primary, self.replica):
            if s is not None:
                with contextlib.suppress(Exception):
                    s.stop()


@contextlib.contextmanager
def started_sentinels() -> Iterator[RedisSentinelServers]:
    """A started sentinel topology, stopped at the end: a process a test froze (SIGSTOP) is woken
    first, or its stop would wait on it."""
    topo = RedisSentinelServers().start()
    try:
        yield topo
    finally:
        procs = [s.proc for s in (topo.primary, topo.replica) if s is not None]
        for proc in [*procs, *(p for _, p, _ in topo.sentinels)]:
            if proc is not None and proc.poll() is None:
                os.kill(proc.pid, signal.SIGCONT)
        topo.stop()
