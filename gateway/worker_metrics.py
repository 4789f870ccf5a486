"""/metrics with `--workers N`: every worker's series, each labelled `worker`, from any worker.

Workers share the port (SO_REUSEPORT), so a scrape lands on one of them at random; exposing
only that worker's counters made every series jump between the workers' values from scrape to
scrape (a counter "reset" to Prometheus at each jump) and showed 1/N of the traffic. Each
worker also serves its own registry on a unix socket in a directory the parent made
(`worker-<i>.sock`); the worker a scrape lands on asks its siblings there and answers with
every worker's samples, labelled `worker="<i>"`, so that `sum by (...)` over `worker` is the
gateway's figure. A sibling that does not answer in time (starting, or gone) is left out, and
`latentgate_workers{state="answered"|"missing"}` says so.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

import aiohttp
from aiohttp import web
from aiohttp.typedefs import Handler
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector
from prometheus_client.samples import Sample

log = logging.getLogger("latentgate.worker_metrics")

SIBLING_TIMEOUT_S = 2.0


@dataclass(frozen=True, slots=True)
class Workers:
    """This worker's place among `count` siblings, and the directory of their sockets."""

    index: int
    count: int
    directory: str

    def socket(self, index: int) -> str:
        return os.path.join(self.directory, f"worker-{index}.sock")


class _Merged(Collector):
    def __init__(self, families: Iterable[Metric]) -> None:
        self._families = list(families)

    def collect(self) -> Iterable[Metric]:
        return self._families


def merge(texts: dict[int, str], count: int) -> bytes:
    """Each worker's exposition, its samples labelled with the worker's index, as one."""
    by_name: dict[str, Metric] = {}
    for index, text in sorted(texts.items()):
        worker = str(index)
        for fam in text_string_to_metric_families(text):
            out = by_name.get(fam.name)
            if out is None:
                out = by_name[fam.name] = Metric(fam.name, fam.documentation, fam.type, fam.unit)
            out.samples.extend(
                Sample(s.name, {**s.labels, "worker": worker}, s.value, s.timestamp, s.exemplar)
                for s in fam.samples
            )
    seen = GaugeMetricFamily(
        "latentgate_workers",
        "Workers whose series this scrape holds (answered) and those that did not answer",
        labels=["state"],
    )
    seen.add_metric(["answered"], len(texts))
    seen.add_metric(["missing"], count - len(texts))
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Merged([*by_name.values(), seen]))
    return generate_latest(registry)


class WorkerMetrics:
    """Serves this worker's own exposition to its siblings and gathers theirs for a scrape."""

    def __init__(
        self,
        workers: Workers,
        render: Callable[[], bytes],
        posts: Mapping[str, Handler] | None = None,
    ) -> None:
        """posts: other calls siblings make on the same socket (gateway.worker_drops)."""
        self.workers = workers
        self._render = render
        self._posts = dict(posts or {})
        self._runner: web.AppRunner | None = None

    async def start(self) -> None:
        app = web.Application()
        app.router.add_get("/metrics", self._own)
        for path, handle in self._posts.items():
            app.router.add_post(path, handle)
        self._runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await self._runner.setup()
        path = self.workers.socket(self.workers.index)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)  # a previous worker's, with this index
        await web.UnixSite(self._runner, path).start()

    async def close(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.workers.socket(self.workers.index))

    async def _own(self, request: web.Request) -> web.Response:
        return web.Response(body=self._render(), content_type="text/plain")

    async def _sibling(self, index: int) -> str | None:
        connector = aiohttp.UnixConnector(path=self.workers.socket(index))
        timeout = aiohttp.ClientTimeout(total=SIBLING_TIMEOUT_S)
        try:
            async with (
                aiohttp.ClientSession(connector=connector, timeout=timeout) as s,
                s.get("http://worker/metrics") as r,
            ):
                if r.status != 200:
                    return None
                return await r.text()
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            log.debug("worker %d did not answer for /metrics: %r", index, exc)
            return None

    async def render(self) -> bytes:
        """Every worker's series, this one's included, each sample labelled `worker`."""
        me = self.workers.index
        others = [i for i in range(self.workers.count) if i != me]
        answers = await asyncio.gather(*(self._sibling(i) for i in others))
        texts = {me: self._render().decode()}
        texts.update({i: t for i, t in zip(others, answers, strict=True) if t is not None})
        return merge(texts, self.workers.count)
