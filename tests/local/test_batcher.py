"""Dynamic batcher: order, batching under concurrency, length buckets, adaptive wait, metrics."""

from __future__ import annotations

import asyncio
import time

import pytest
from prometheus_client import CollectorRegistry

from backends.batcher import Batcher
from backends.errors import EngineError
from backends.settings import BatcherSettings
from tests.local.batcher_support import Gate, Recorder, batcher


async def test_results_come_back_in_order_under_concurrency() -> None:
    rec = Recorder(delay_s=0.005)
    b = batcher(rec, max_batch=8, max_delay_ms=5)
    requests = [[(f"r{i}-{j}", 1 + (i * j) % 40) for j in range(i % 4 + 1)] for i in range(40)]
    results = await asyncio.gather(*(b.submit(r) for r in requests))
    for req, res in zip(requests, results, strict=True):
        assert res == [f"{t}:{n}" for t, n in req]
    assert max(len(x) for x in rec.batches) > 1, "concurrent callers were never batched"
    assert all(len(x) <= 8 for x in rec.batches)
    await b.aclose()


async def test_length_buckets_keep_short_and_long_apart() -> None:
    rec = Recorder(delay_s=0.002)
    b = batcher(rec, max_batch=64, max_delay_ms=20, buckets=[16, 64])
    items = [(f"s{i}", 5) for i in range(10)] + [(f"l{i}", 60) for i in range(10)]
    await asyncio.gather(*(b.submit([it]) for it in items))
    for batch in rec.batches:
        lengths = {n for _, n in batch}
        assert lengths == {5} or lengths == {60}, f"mixed bucket {batch}"
    await b.aclose()


async def test_batching_off_runs_each_request_alone() -> None:
    rec = Recorder()
    b = batcher(rec, enabled=False)
    await asyncio.gather(*(b.submit([(f"x{i}", 3), (f"y{i}", 3)]) for i in range(5)))
    assert sorted(len(x) for x in rec.batches) == [2] * 5
    await b.aclose()


async def test_adaptive_mode_does_not_wait_when_traffic_is_light() -> None:
    rec = Recorder()
    b = batcher(rec, max_batch=32, max_delay_ms=200, target_p95_ms=50)
    t0 = time.perf_counter()
    for i in range(3):
        await b.submit([(f"a{i}", 4)])
        await asyncio.sleep(0.05)
    # A fixed 200 ms wait would take ≥ 0.6 s for three sequential requests.
    assert time.perf_counter() - t0 - 0.15 < 0.3
    await b.aclose()


async def test_fixed_wait_gathers_a_burst_into_one_batch() -> None:
    rec = Recorder()
    b = batcher(rec, max_batch=16, max_delay_ms=50)
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
    b = batcher(rec, max_batch=4, max_delay_ms=1)
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
    b = batcher(rec, registry=reg, max_batch=4, max_delay_ms=20, buckets=[100])
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
    b = batcher(Recorder())
    await b.aclose()
    with pytest.raises(EngineError, match="shut down"):
        await b.submit([("x", 1)])


def test_one_batcher_serves_successive_event_loops() -> None:
    """A long-lived encoder (e.g. a session fixture) is used from several loops in turn."""
    rec = Recorder()
    b = batcher(rec, max_delay_ms=1)
    assert asyncio.run(b.submit([("first", 1)])) == ["first:1"]
    assert asyncio.run(b.submit([("second", 1)])) == ["second:1"]
    asyncio.run(b.aclose())


async def test_close_during_a_batch_fails_its_callers_instead_of_hanging() -> None:
    b = batcher(Recorder(delay_s=0.2), max_delay_ms=1)  # a wait: through the gathering task
    job = asyncio.ensure_future(b.submit([("slow", 1)]))
    await asyncio.sleep(0.05)  # the batch is running in the worker thread
    await b.aclose()
    with pytest.raises(EngineError, match="shutting down"):
        await asyncio.wait_for(job, 2)


async def test_a_huge_request_is_interleaved_with_requests_sent_after_it() -> None:
    """80 long items (ten runs of 8): a short and a long one-item request sent while its first
    run is in the engine go in the next runs, not after all ten."""
    gate = Gate()
    b = batcher(gate, max_batch=8, max_delay_ms=0, buckets=[16, 64])
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
    b = batcher(gate, max_batch=4, max_delay_ms=0, buckets=[16, 64])
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
    b = batcher(rec, max_batch=4, max_delay_ms=0, buckets=[16, 32, 64])
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
