"""Background loops on Redis end when their owner closes, even when the cancel lands inside a
command: redis-py's asyncio client may finish that command and return its reply, spending the
cancel, and a single cancel-then-await waited for ever (a gateway whose shutdown hung)."""

from __future__ import annotations

import asyncio

import pytest
from redis.asyncio import Redis

from cache.redis_client import stop_task
from tests.support.servers import RedisServer


async def _loop(client: Redis, commands: list[int]) -> None:
    while True:
        await client.get("stop-task-probe")
        commands.append(1)
        await asyncio.sleep(3600)


async def test_a_loop_stopped_at_any_point_of_a_command_ends(redis_server: RedisServer) -> None:
    client = Redis.from_url(redis_server.url)
    await client.ping()  # warm: the cancel then lands mid-command, not while connecting
    spent = 0
    try:
        for i in range(30):
            commands: list[int] = []
            task = asyncio.create_task(_loop(client, commands))
            for _ in range(i % 3):
                await asyncio.sleep(0)  # the cancel lands at a different step each time
            await asyncio.wait_for(stop_task(task), 10)
            assert task.cancelled()
            spent += len(commands)  # the command finished although the task was cancelled
        await client.ping()  # and the client's connections are still usable
    finally:
        await client.aclose()
    print(f"cancels redis-py spent on a command in flight: {spent} of 30")


async def test_a_task_that_had_failed_is_logged_and_the_closer_goes_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def fails() -> None:
        raise ValueError("a record this version cannot read")

    task = asyncio.create_task(fails(), name="semantic-budget-sync")
    await asyncio.wait({task})
    await stop_task(task)  # no raise: the owner's aclose still closes its clients
    assert "semantic-budget-sync" in caplog.text and "cannot read" in caplog.text
