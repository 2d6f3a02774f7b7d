"""async use: apredict awaits without blocking the event loop."""

from __future__ import annotations

import asyncio
import time

import pytest

from streamer_core import StreamerTimeoutError, ThreadedStreamer


def slow_double(batch):
    time.sleep(0.05)
    return [x * 2 for x in batch]


def test_apredict_batches_concurrent_coroutines_without_blocking_the_loop(closing):
    calls = []

    def model(batch):
        calls.append(len(batch))
        return slow_double(batch)

    streamer = closing(ThreadedStreamer(model, batch_size=32, max_latency=0.05))

    async def main():
        ticks = 0

        async def ticker():
            nonlocal ticks
            while True:
                await asyncio.sleep(0.005)
                ticks += 1

        tick = asyncio.ensure_future(ticker())
        results = await asyncio.gather(*(streamer.apredict([x]) for x in range(32)))
        tick.cancel()
        return results, ticks

    results, ticks = asyncio.run(main())
    assert results == [[x * 2] for x in range(32)]
    assert max(calls) > 1, "concurrent coroutines should share batches"
    assert ticks >= 5, "the event loop was blocked while waiting"


def test_apredict_timeout(closing, gate):
    streamer = closing(ThreadedStreamer(gate, batch_size=4, max_latency=0.01))

    async def main():
        await streamer.apredict(["hold"], timeout=0.1)

    with pytest.raises(StreamerTimeoutError):
        asyncio.run(main())


def test_futures_work_with_concurrent_futures_wait_and_as_completed(closing):
    import concurrent.futures

    streamer = closing(ThreadedStreamer(slow_double, batch_size=8, max_latency=0.01))
    futures = [streamer.submit([x]) for x in range(10)]
    done, not_done = concurrent.futures.wait(futures, timeout=10)
    assert not not_done and len(done) == 10
    more = [streamer.submit([x]) for x in range(10)]
    assert sorted(f.result()[0] for f in concurrent.futures.as_completed(more, timeout=10)) == [
        x * 2 for x in range(10)
    ]
    calls = []
    last = streamer.submit([21])
    last.add_done_callback(calls.append)
    assert last.result(5) == [42]
    assert calls == [last]
