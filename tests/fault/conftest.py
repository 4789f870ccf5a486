"""Fault-test fixtures: model replicas as real processes (so they can be killed) and a load loop."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import pytest

from tests.support.servers import ROOT, free_port, wait_port

ADMIN_TOKEN = "fault-token"
CHAT = {"model": "m", "messages": [{"role": "user", "content": "hello"}], "temperature": 0}


class Replica:
    """`python -m tests.support.upstream` on its own port, with optional injected faults."""

    def __init__(self, name: str, *args: str) -> None:
        self.name = name
        self.port = free_port()
        self.args = args
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> Replica:
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.support.upstream",
                "--port",
                str(self.port),
                "--name",
                self.name,
                *self.args,
            ],
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        wait_port("127.0.0.1", self.port, 30)
        return self

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    async def stats(self) -> dict[str, Any]:
        async with aiohttp.ClientSession() as s, s.get(self.url + "/_test/stats") as r:
            return dict(await r.json())


class Replicas(list[Replica]):
    def start(self, *specs: tuple[str, ...]) -> list[Replica]:
        started = [Replica(f"r{len(self) + i}", *spec) for i, spec in enumerate(specs)]
        for r in started:
            self.append(r)
        for r in started:
            r.start()
        return started


@pytest.fixture
def replicas() -> Iterator[Replicas]:
    group = Replicas()
    yield group
    for r in group:
        r.kill()


def pool_config(
    urls: list[str], routes: list[dict[str, Any]] | None = None, **backend: Any
) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "kind": "remote",
        "replicas": urls,
        "timeouts": {"connect": 1, "read": 5, "total": 10},
    }
    spec.update(backend)
    return {
        "admin": {"token": ADMIN_TOKEN},
        "backends": {"pool": spec},
        "routes": routes
        or [
            {
                "name": "chat",
                "match": {"path": "/v1/chat/completions", "methods": ["POST"]},
                "protocol": "openai",
                "backend": "pool",
            },
        ],
    }


@dataclass
class LoadResult:
    statuses: list[int] = field(default_factory=list)
    latencies: list[float] = field(default_factory=list)
    served_by: list[str] = field(default_factory=list)

    def p(self, q: float) -> float:
        xs = sorted(self.latencies)
        return xs[min(len(xs) - 1, int(q / 100 * len(xs)))]


async def load(
    url: str,
    n: int,
    concurrency: int,
    *,
    path: str = "/v1/chat/completions",
    body: dict[str, Any] | None = None,
    headers: dict[str, str] | None = None,
    on_progress: Any = None,
) -> LoadResult:
    """n POSTs from `concurrency` workers; on_progress(done) runs after each response."""
    out = LoadResult()
    queue = iter(range(n))
    async with aiohttp.ClientSession() as s:

        async def worker() -> None:
            for _ in queue:
                t = time.perf_counter()
                async with s.post(url + path, json=body or CHAT, headers=headers) as r:
                    await r.read()
                    out.statuses.append(r.status)
                    out.served_by.append(r.headers.get("X-Upstream", ""))
                out.latencies.append(time.perf_counter() - t)
                if on_progress is not None:
                    on_progress(len(out.statuses))

        await asyncio.gather(*(worker() for _ in range(concurrency)))
    return out


async def admin_backends(url: str) -> dict[str, Any]:
    async with (
        aiohttp.ClientSession() as s,
        s.get(url + "/admin/backends", headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}) as r,
    ):
        assert r.status == 200
        return dict(await r.json())


async def metric(url: str, name: str, **labels: str) -> float:
    """Sum of a Prometheus sample over series matching the given labels."""
    async with aiohttp.ClientSession() as s, s.get(url + "/metrics") as r:
        text = await r.text()
    total = 0.0
    for line in text.splitlines():
        if not line.startswith(name + "{") and not line.startswith(name + " "):
            continue
        if all(f'{k}="{v}"' in line for k, v in labels.items()):
            total += float(line.rsplit(" ", 1)[1])
    return total
