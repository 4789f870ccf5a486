"""Dynamic batcher: order, batching under concurrency, length buckets, adaptive wait, metrics."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from backends.batcher import Batcher
from backends.errors import EngineError
from backends.settings import BatcherSettings


class Recorder:
    def __init__(self, delay_s: float = 0.0) -> None:
        self.batches: list[list[tuple[str, int]]] = []
        self.delay_s = delay_s
        self.threads: set[str] = set()

    def __call__(self, items: list[tuple[str, int]]) -> list[str]:
        self.threads.add(threading.current_thread().name)
        self.batches.append(list(items))
        time.sleep(self.delay_s)
        return [f"{text}:{n}" for text, n in items]


def _batcher(
    rec: Recorder, registry: CollectorRegistry | None = None, **kw: Any
) -> Batcher[tuple[str, int], str]:
    settings = BatcherSettings.model_validate(kw)
    return Batcher("m", rec, settings, length=lambda it: it[1], registry=registry)


async def test_results_come_back_in_order_under_concurrency() -> None:
    rec = Recorder(delay_s=0.005)
    b = _batcher(rec, max_batch=8, max_delay_ms=5)
    requests = [[(f"r{i}-{j}", 1 + (i * j) % 40) for j in range(i % 4 + 1)] for i in range(40)]
    results = await asyncio.gather(*(b.submit(r) for r in requests))
    for req, res in zip(requests, results, strict=True):
        assert res == [f"{t}:{n}" for t, n in req]
    assert max(len(x) for x in rec.batches) > 1, "concurrent callers were never batched"
    assert all(len(x) <= 8 for x in rec.batches)
    await b.aclose()


async def test_length_buckets_keep_short_and_long_apart() -> None:
    rec = Recorder(delay_s=0.002)
    b = _batcher(rec, max_batch=64, max_delay_ms=20, buckets=[16, 64])
    items = [(f"s{i}", 5) for i in range(10)] + [(f"l{i}", 60) for i in range(10)]
    await asyncio.gather(*(b.submit([it]) for it in items))
    for batch in rec.batches:
        lengths = {n for _, n in batch}
        assert lengths == {5} or lengths == {60}, f"mixed bucket {batch}"
    await b.aclose()


async def test_batching_off_runs_each_request_alone() -> None:
    rec = Recorder()
    b = _batcher(rec, enabled=False)
    await asyncio.gather(*(b.submit([(f"x{i}", 3), (f"y{i}", 3)]) for i in range(5)))
    assert sorted(len(x) for x in rec.batches) == [2] * 5
    await b.aclose()


async def test_adaptive_mode_does_not_wait_when_traffic_is_light() -> None:
    rec = Recorder()
    b = _batcher(rec, max_batch=32, max_delay_ms=200, target_p95_ms=50)
    t0 = time.perf_counter()
    for i in range(3):
        await b.submit([(f"a{i}", 4)])
        await asyncio.sleep(0.05)
    # A fixed 200 ms wait would take ≥ 0.6 s for three sequential requests.
    assert time.perf_counter() - t0 - 0.15 < 0.3
    await b.aclose()


async def test_fixed_wait_gathers_a_burst_into_one_batch() -> None:
    rec = Recorder()
    b = _batcher(rec, max_batch=16, max_delay_ms=50)
    await asyncio.gather(*(b.submit([(f"a{i}", 4)]) for i in range(16)))
    assert [len(x) for x in rec.batches] == [16]
    await b.aclose()


async def test_engine_error_reaches_every_caller_of_that_batch() -> None:
    def boom(items: list[tuple[str, int]]) -> list[str]:
        raise EngineError("engine exploded")

    b = Batcher("m", boom, BatcherSettings(max_delay_ms=5), length=lambda it: it[1])
    results = await asyncio.gather(
        *(b.submit([("x", 1)]) for _ in range(3)), return_exceptions=True
    )
    assert all(isinstance(r, EngineError) and "exploded" in str(r) for r in results)
    await b.aclose()


async def test_cancelled_caller_does_not_break_the_others() -> None:
    rec = Recorder(delay_s=0.02)
    b = _batcher(rec, max_batch=4, max_delay_ms=1)
    first = asyncio.ensure_future(b.submit([("busy", 1)]))
    await asyncio.sleep(0.005)
    doomed = asyncio.ensure_future(b.submit([("doomed", 1)]))
    ok = asyncio.ensure_future(b.submit([("ok", 1)]))
    await asyncio.sleep(0)
    doomed.cancel()
    assert await ok == ["ok:1"]
    assert await first == ["busy:1"]
    assert all("doomed" not in t for batch in rec.batches for t, _ in batch)
    await b.aclose()


async def test_metrics_record_batch_size_delay_and_padding() -> None:
    reg = CollectorRegistry()
    rec = Recorder()
    b = _batcher(rec, registry=reg, max_batch=4, max_delay_ms=20, buckets=[100])
    await asyncio.gather(*(b.submit([(f"x{i}", n)]) for i, n in enumerate([10, 10, 10, 30])))
    assert reg.get_sample_value("latentgate_batch_size_count", {"model": "m"}) == 1
    assert reg.get_sample_value("latentgate_batch_size_sum", {"model": "m"}) == 4
    assert reg.get_sample_value("latentgate_batch_queue_delay_seconds_count", {"model": "m"}) == 4
    # 60 real tokens in 4 x 30 slots: half of the batch is padding.
    assert reg.get_sample_value(
        "latentgate_batch_padding_ratio_sum", {"model": "m"}
    ) == pytest.approx(0.5)
    await b.aclose()


async def test_closed_batcher_refuses_new_work() -> None:
    b = _batcher(Recorder())
    await b.aclose()
    with pytest.raises(EngineError, match="shut down"):
        await b.submit([("x", 1)])


def test_one_batcher_serves_successive_event_loops() -> None:
    """A long-lived encoder (e.g. a session fixture) is used from several loops in turn."""
    rec = Recorder()
    b = _batcher(rec, max_delay_ms=1)
    assert asyncio.run(b.submit([("first", 1)])) == ["first:1"]
    assert asyncio.run(b.submit([("second", 1)])) == ["second:1"]
    asyncio.run(b.aclose())


async def test_close_during_a_batch_fails_its_callers_instead_of_hanging() -> None:
    b = _batcher(Recorder(delay_s=0.2), max_delay_ms=1)  # a wait: through the gathering task
    job = asyncio.ensure_future(b.submit([("slow", 1)]))
    await asyncio.sleep(0.05)  # the batch is running in the worker thread
    await b.aclose()
    with pytest.raises(EngineError, match="shutting down"):
        await asyncio.wait_for(job, 2)


async def test_close_during_a_lone_run_answers_its_caller_instead_of_hanging() -> None:
    b = _batcher(Recorder(delay_s=0.2), max_delay_ms=0)  # no wait: run from the caller's task
    job = asyncio.ensure_future(b.submit([("slow", 1)]))
    await asyncio.sleep(0.05)  # the run is in the worker thread
    await b.aclose()  # waits for the run: its answer is whole
    assert await asyncio.wait_for(job, 2) == ["slow:1"]


class Gate(Recorder):
    """Holds the first engine run until released, so callers can queue work behind it."""

    def __init__(self) -> None:
        super().__init__()
        self.running = threading.Event()
        self.release = threading.Event()

    def __call__(self, items: list[tuple[str, int]]) -> list[str]:
        self.running.set()
        self.release.wait(10)
        return super().__call__(items)

    def run_of(self, text: str) -> int:
        return next(i for i, batch in enumerate(self.batches) if any(t == text for t, _ in batch))


async def test_a_huge_request_is_interleaved_with_requests_sent_after_it() -> None:
    """80 long items (ten runs of 8): a short and a long one-item request sent while its first
    run is in the engine go in the next runs, not after all ten."""
    gate = Gate()
    b = _batcher(gate, max_batch=8, max_delay_ms=0, buckets=[16, 64])
    huge = asyncio.ensure_future(b.submit([(f"h{i}", 60) for i in range(80)]))
    assert await asyncio.to_thread(gate.running.wait, 10)
    short = asyncio.ensure_future(b.submit([("short", 5)]))
    long = asyncio.ensure_future(b.submit([("long", 60)]))  # the huge request's bucket
    await asyncio.sleep(0)  # both are queued
    gate.release.set()
    await asyncio.gather(huge, short, long)
    assert len(gate.batches) == 12  # 81 long items in 11 runs, the short one alone
    # Run 0 was in the engine; run 1 is the huge request's batch due on the same turn as theirs.
    assert gate.run_of("short") == 2
    assert gate.run_of("long") == 3
    assert all(t.startswith("h") for t, _ in gate.batches[1])
    await b.aclose()


async def test_a_bucket_kept_full_does_not_starve_an_older_item_in_another() -> None:
    """Two callers keep the long bucket full with back-to-back requests of a batch and a half;
    a short item sent meanwhile runs before any request sent after it."""
    gate = Gate()
    b = _batcher(gate, max_batch=4, max_delay_ms=0, buckets=[16, 64])
    sent: list[str] = []  # request names, in the order they were queued

    async def flood(client: int) -> None:
        for r in range(8):
            name = f"f{client}.{r}"
            sent.append(name)
            await b.submit([(f"{name}.{i}", 60) for i in range(6)])

    floods = [asyncio.ensure_future(flood(c)) for c in (0, 1)]
    assert await asyncio.to_thread(gate.running.wait, 10)
    sent.append("short")
    short = asyncio.ensure_future(b.submit([("short", 5)]))
    await asyncio.sleep(0)
    gate.release.set()
    await asyncio.gather(short, *floods)
    younger = set(sent[sent.index("short") + 1 :])
    assert younger, "the flood stopped before the short item was sent"
    ran_before = {
        t.rsplit(".", 1)[0] for batch in gate.batches[: gate.run_of("short")] for t, _ in batch
    }
    assert not ran_before & younger, f"requests sent after it ran first: {ran_before & younger}"
    await b.aclose()


@pytest.mark.parametrize(
    ("lengths", "most"),
    [
        ([60], 2),  # one bucket: the huge request's batch due on its turn, and a run starting
        ([60, 30], 4),  # two buckets: a batch of each is due on every turn
    ],
)
async def test_one_request_after_another_keeps_its_place_beside_a_huge_one(
    lengths: list[int], most: int
) -> None:
    """A client sends short requests one after another while a huge request runs: each goes
    within the runs due on its turn. Before, the clock moved one turn per run, so every run the
    huge request did not get (the short ones', its other bucket's) put it further behind the
    clock, and each short request waited behind all of that: 1, 2, 3, ... runs, up to most of
    the huge request (a one-sentence /v1/embeddings beside a 1024-text one: 0.5 s, then 7-9 s)."""
    rec = Recorder(delay_s=0.005)
    b = _batcher(rec, max_batch=4, max_delay_ms=0, buckets=[16, 32, 64])
    texts = [(f"h{i}", lengths[i % len(lengths)]) for i in range(160)]  # 40 runs
    huge = asyncio.ensure_future(b.submit(texts))
    await asyncio.sleep(0.02)
    waits = []  # runs started after each short request was queued, before its own
    for n in range(8):
        started = len(rec.batches)
        await b.submit([(f"s{n}", 5)])
        own = next(i for i, batch in enumerate(rec.batches) if batch[0][0] == f"s{n}")
        waits.append(own - started)
    assert max(waits) <= most, f"runs each short request waited: {waits}"
    assert not huge.done(), "the huge request ended before the short ones: nothing was tested"
    await huge
    await b.aclose()


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
    b = _batcher(gate, max_batch=8, max_delay_ms=50, target_p95_ms=100)
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
    b = _batcher(rec, max_batch=4, max_delay_ms=5, target_p95_ms=20)

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
    b = _batcher(gate, max_batch=8, max_delay_ms=50, target_p95_ms=100)
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
    b = _batcher(rec, max_batch=32, max_delay_ms=50, target_p95_ms=100, buckets=[16, 64])
    items = [(f"s{i}", 5) for i in range(6)] + [("long", 60)]
    assert await b.submit(items) == [f"{t}:{n}" for t, n in items]
    assert sorted(len(x) for x in rec.batches) == [1, 6]
    await b.aclose()


async def test_requests_arriving_one_by_one_behind_the_first_lone_run_gather_after_it() -> None:
    """The first lone run of a batcher (no gathering task yet): requests that come one at a
    time while it holds the engine still wait it out and go as one batch. Starting the
    gathering task forgot the run in flight, so each went to the engine alone behind it."""
    gate = Gate()
    b = _batcher(gate, max_batch=8, max_delay_ms=50, target_p95_ms=100)
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
    b = _batcher(gate, max_batch=8, max_delay_ms=0)
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
