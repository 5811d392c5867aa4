"""asyncio: push futures, acks and pulls are awaitable and never block the
event loop; `async for` ends at the end of the stream."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

import strom


def test_awaited_pushes_and_async_for_consume_everything(driver, ptype):
    t = driver.create_topic("aio", 2, type=ptype)

    async def main():
        p = t.producer()
        ids = await asyncio.gather(*(p.push({"i": i}, bytes([i % 256]) * 10) for i in range(200)))
        assert sorted((i.partition, i.offset) for i in ids) == sorted(
            (k % 2, k // 2) for k in range(200)
        )
        p.close()
        seen = []
        async for ev in t.consumer("c"):
            seen.append(ev.metadata["i"])
            assert bytes(ev.data) == bytes([ev.metadata["i"] % 256]) * 10
            await ev.ack()
        return seen

    seen = asyncio.run(main())
    assert sorted(seen) == list(range(200))
    assert driver.consumer_offsets("aio", 0) == {"c": 100}


def test_waiting_for_events_does_not_block_the_event_loop(driver):
    t = driver.create_topic("aio-wait", 1, type="memory")

    def late_producer():
        time.sleep(0.5)
        with t.producer() as p:
            p.push({"late": True})

    async def ticker(stop):
        ticks = 0
        while not stop.is_set():
            await asyncio.sleep(0.01)
            ticks += 1
        return ticks

    async def main():
        c = t.consumer("c")
        stop = asyncio.Event()
        tick_task = asyncio.create_task(ticker(stop))
        threading.Thread(target=late_producer).start()
        ev = await c.pull_async(timeout=30)
        end = await c.pull_async(timeout=30)
        stop.set()
        return ev, end, await tick_task

    ev, end, ticks = asyncio.run(main())
    assert ev.metadata == {"late": True}
    assert end is None, "pull_async resolves to None at the end of the stream"
    assert ticks >= 20, f"the event loop ran only {ticks} ticks while waiting"


def test_pull_async_times_out_with_a_strom_timeout(driver):
    t = driver.create_topic("aio-timeout", 1, type="memory")

    async def main():
        with pytest.raises(strom.TimeoutError) as err:
            await t.consumer("c").pull_async(timeout=0.2)
        assert err.value.code == 502

    asyncio.run(main())


def test_awaiting_a_failed_push_raises_its_error(driver):
    t = driver.create_topic("aio-fail", 1, type="memory")
    p = t.producer()
    t.complete()

    async def main():
        with pytest.raises(strom.TopicClosed):
            await p.push({"x": 1})

    asyncio.run(main())


def test_a_cancelled_pull_takes_no_event(driver):
    t = driver.create_topic("aio-cancel", 1, type="memory")

    async def main():
        c = t.consumer("c")
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(c.pull_async(), 0.2)
        await asyncio.sleep(0.05)
        with t.producer() as p:
            p.push({"i": 0})
            p.push({"i": 1})
        return [(await c.pull_async(timeout=30)).metadata["i"] for _ in range(2)]

    assert asyncio.run(main()) == [0, 1]


def test_pull_async_refuses_a_negative_timeout_and_takes_a_huge_one_as_none(driver):
    t = driver.create_topic("aio-bad", 1, type="memory")
    c = t.consumer("c")

    async def main():
        with pytest.raises(strom.InvalidArgument):
            await c.pull_async(timeout=-1)
        with t.producer() as p:
            p.push({"i": 1}, b"x")
        ev = await c.pull_async(timeout=1e300)  # beyond any Duration: no limit
        return ev.metadata

    assert asyncio.run(main()) == {"i": 1}
