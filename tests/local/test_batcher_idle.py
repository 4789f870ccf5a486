"""The batcher's idle path: a lone request with nothing queued or running runs from its
caller's task; what comes meanwhile gathers behind it; runs never overlap."""

from __future__ import annotations

import asyncio
import threading

import pytest

from backends.batcher import Batcher
from backends.errors import EngineError
from backends.settings import BatcherSettings
from tests.local.batcher_support import Gate, Recorder, batcher


async def test_close_during_a_lone_run_answers_its_caller_instead_of_hanging() -> None:
    b = batcher(Recorder(delay_s=0.2), max_delay_ms=0)  # no wait: run from the caller's task
    job = asyncio.ensure_future(b.submit([("slow", 1)]))
    await asyncio.sleep(0.05)  # the run is in the worker thread
    await b.aclose()  # waits for the run: its answer is whole
    assert await asyncio.wait_for(job, 2) == ["slow:1"]


class Overlap(Recorder):
    """Counts engine runs in flight at once (the engine is one thread's: never more than one)."""

    def __init__(self, delay_s: float) -> None:
        super().__init__(delay_s)
        self.now = 0
        self.most = 0
        self.lock = threading.Lock()

    def __call__(self, items: list[tuple[str, int]]) -> list[str]:
        with self.lock:
            self.now += 1
            self.most = max(self.most, self.now)
        try:
            return super().__call__(items)
        finally:
            with self.lock:
                self.now -= 1


async def test_a_lone_request_runs_at_once_and_what_comes_meanwhile_is_batched_after_it() -> None:
    """With nothing queued and no company expected, a request runs from its caller's task
    (no turn through the gathering task). Requests sent while it holds the engine gather into
    one batch behind it, as behind any batch, and runs never overlap."""
    gate = Gate()
    b = batcher(gate, max_batch=8, max_delay_ms=50, target_p95_ms=100)
    lone = asyncio.ensure_future(b.submit([("lone", 3)]))
    assert await asyncio.to_thread(gate.running.wait, 10)
    assert b._task is None, "the lone request went through the gathering task"
    later = [asyncio.ensure_future(b.submit([(f"m{i}", 3)])) for i in range(5)]
    await asyncio.sleep(0.01)
    gate.release.set()
    assert await lone == ["lone:3"]
    assert [await f for f in later] == [[f"m{i}:3"] for i in range(5)]
    assert [len(x) for x in gate.batches] == [1, 5]
    await b.aclose()


async def test_runs_never_overlap_when_lone_and_queued_requests_mix() -> None:
    rec = Overlap(delay_s=0.002)
    b = batcher(rec, max_batch=4, max_delay_ms=5, target_p95_ms=20)

    async def client(c: int) -> None:
        for r in range(15):
            assert await b.submit([(f"c{c}.{r}", 2)]) == [f"c{c}.{r}:2"]
            await asyncio.sleep(0.001 * (c % 3))

    await asyncio.gather(*(client(c) for c in range(6)))
    assert rec.most == 1
    assert sum(len(x) for x in rec.batches) == 90
    await b.aclose()


async def test_a_lone_caller_cancelled_mid_run_leaves_the_engine_serving() -> None:
    gate = Gate()
    b = batcher(gate, max_batch=8, max_delay_ms=50, target_p95_ms=100)
    doomed = asyncio.ensure_future(b.submit([("doomed", 3)]))
    assert await asyncio.to_thread(gate.running.wait, 10)
    doomed.cancel()
    after = asyncio.ensure_future(b.submit([("after", 3)]))
    await asyncio.sleep(0.01)
    gate.release.set()
    assert await asyncio.wait_for(after, 5) == ["after:3"]
    assert await asyncio.wait_for(b.submit([("again", 3)]), 5) == ["again:3"]
    await b.aclose()


async def test_an_engine_error_on_a_lone_run_reaches_its_caller() -> None:
    def boom(items: list[tuple[str, int]]) -> list[str]:
        raise EngineError("engine exploded")

    settings = BatcherSettings(max_delay_ms=5, target_p95_ms=20)
    b = Batcher("m", boom, settings, length=lambda it: it[1])
    with pytest.raises(EngineError, match="exploded"):
        await b.submit([("x", 1)])
    with pytest.raises(EngineError, match="exploded"):
        await b.submit([("y", 1)])
    await b.aclose()


async def test_a_lone_request_of_mixed_lengths_still_runs_each_bucket_apart() -> None:
    """The idle path takes only items of one length bucket: one long text beside short ones
    would pad every short one to its length in a single run."""
    rec = Recorder()
    b = batcher(rec, max_batch=32, max_delay_ms=50, target_p95_ms=100, buckets=[16, 64])
    items = [(f"s{i}", 5) for i in range(6)] + [("long", 60)]
    assert await b.submit(items) == [f"{t}:{n}" for t, n in items]
    assert sorted(len(x) for x in rec.batches) == [1, 6]
    await b.aclose()


async def test_requests_arriving_one_by_one_behind_the_first_lone_run_gather_after_it() -> None:
    """The first lone run of a batcher (no gathering task yet): requests that come one at a
    time while it holds the engine still wait it out and go as one batch. Starting the
    gathering task forgot the run in flight, so each went to the engine alone behind it."""
    gate = Gate()
    b = batcher(gate, max_batch=8, max_delay_ms=50, target_p95_ms=100)
    lone = asyncio.ensure_future(b.submit([("lone", 3)]))
    assert await asyncio.to_thread(gate.running.wait, 10)
    later = []
    for i in range(3):
        later.append(asyncio.ensure_future(b.submit([(f"m{i}", 3)])))
        await asyncio.sleep(0.02)  # each its own arrival, the engine still held
    gate.release.set()
    assert await lone == ["lone:3"]
    assert [await f for f in later] == [[f"m{i}:3"] for i in range(3)]
    assert [len(x) for x in gate.batches] == [1, 3]
    await b.aclose()


class Turnstile(Recorder):
    """Holds each engine run until the test opens it, run by run."""

    def __init__(self, runs: int) -> None:
        super().__init__()
        self.entered = [threading.Event() for _ in range(runs)]
        self.opened = [threading.Event() for _ in range(runs)]

    def __call__(self, items: list[tuple[str, int]]) -> list[str]:
        n = len(self.batches)
        self.entered[n].set()
        self.opened[n].wait(10)
        return super().__call__(items)


async def test_a_request_that_comes_while_a_batch_runs_gathers_behind_it() -> None:
    """The idle path is for an idle engine: a request that comes while the gathering task's
    batch is in the engine (nothing queued) waits in the queue with what comes after it, as
    it did before the idle path, rather than go to the engine alone behind the batch."""
    gate = Turnstile(4)
    b = batcher(gate, max_batch=8, max_delay_ms=0)
    lone = asyncio.ensure_future(b.submit([("a", 3)]))
    assert await asyncio.to_thread(gate.entered[0].wait, 10)
    queued = [asyncio.ensure_future(b.submit([(t, 3)])) for t in ("b", "c")]
    await asyncio.sleep(0.01)
    gate.opened[0].set()
    assert await asyncio.to_thread(gate.entered[1].wait, 10)  # b and c, from the queue
    behind = [asyncio.ensure_future(b.submit([(t, 3)])) for t in ("d", "e")]
    await asyncio.sleep(0.01)
    for opened in gate.opened[1:]:
        opened.set()
    assert await lone == ["a:3"]
    assert [await f for f in queued + behind] == [[f"{t}:3"] for t in "bcde"]
    assert [[t for t, _ in x] for x in gate.batches] == [["a"], ["b", "c"], ["d", "e"]]
    await b.aclose()
