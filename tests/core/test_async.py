"""async use: apredict awaits without blocking the event loop."""

from __future__ import annotations

import asyncio
import sys
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


def test_waiters_and_callbacks_that_race_a_completion_are_all_woken():
    """A future makes its condition on first use (a wait, a callback, a
    cancel): whichever of that and its completion comes first, every waiter
    wakes, every callback fires once, and a cancel and a result never both win."""
    import concurrent.futures
    import random
    import threading

    from streamer_core.future import BatchFuture

    n = 3000
    futures = [BatchFuture() for _ in range(n)]
    for future in futures:
        future._deadline = time.monotonic() + 30
    fired = [0] * n
    set_ok = [False] * n
    waits_done = []
    start = threading.Barrier(4)

    def deliver():
        start.wait()
        for i, future in enumerate(futures):
            set_ok[i] = future._set_quietly([i])
            if set_ok[i]:  # as deliver() does: a cancel has woken its waiter already
                future._wake()

    def wait_each():
        start.wait()
        for future in futures:
            done, _ = concurrent.futures.wait([future], timeout=10)
            waits_done.append(bool(done))

    def add_callbacks():
        start.wait()
        for i, future in enumerate(futures):
            future.add_done_callback(lambda _f, i=i: fired.__setitem__(i, fired[i] + 1))

    def cancel_some():
        start.wait()
        rng = random.Random(5)
        for future in futures:
            if rng.random() < 0.2:
                future.cancel()

    threads = [threading.Thread(target=t) for t in (deliver, wait_each, add_callbacks, cancel_some)]
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)  # threads change hands often: the races happen
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
    finally:
        sys.setswitchinterval(interval)
    assert not any(thread.is_alive() for thread in threads)
    assert waits_done == [True] * n, "a waiter was not woken"
    assert fired == [1] * n, "a callback fired twice or never"
    for i, future in enumerate(futures):
        assert future.done()
        assert future.cancelled() != set_ok[i], f"future {i}: cancelled and completed, or neither"
        if set_ok[i]:
            assert future.result(0) == [i]
    assert "finished" in repr(futures[0]) or "cancelled" in repr(futures[0])


def test_a_cancelled_or_given_up_call_counts_as_done_for_wait_and_as_completed(closing, gate):
    import concurrent.futures

    streamer = closing(ThreadedStreamer(gate, batch_size=4, max_latency=0.01))
    held = streamer.submit(["hold"])
    assert gate.entered.wait(5)
    cancelled = streamer.submit(["queued"])
    assert cancelled.cancel()
    given_up = streamer.submit(["queued too"])
    with pytest.raises(StreamerTimeoutError):
        given_up.result(0.05)
    started = time.monotonic()
    done, not_done = concurrent.futures.wait([cancelled, given_up], timeout=5)
    assert done == {cancelled, given_up} and not not_done
    assert set(concurrent.futures.as_completed([cancelled, given_up], timeout=5)) == {cancelled, given_up}
    assert time.monotonic() - started < 1.0, "wait() sat out its timeout on a cancelled call"
    gate.release()
    assert held.result(5) == ["ok:hold"]


def test_a_future_makes_on_first_use_all_that_the_standard_future_makes():
    """BatchFuture does not call Future.__init__: it sets the state itself
    and makes the rest on first use. Should a Python version's Future start
    with anything else, this fails here rather than in users' calls."""
    import concurrent.futures

    from streamer_core.future import _LAZY_PARTS, BatchFuture

    standard = set(vars(concurrent.futures.Future()))
    ours = BatchFuture()
    assert standard - set(vars(ours)) == set(_LAZY_PARTS)
    ours._condition  # noqa: B018 - made on first use
    assert standard <= set(vars(ours))


def test_an_answered_call_completes_without_its_futures_condition(closing):
    """The common case takes the fast path: nothing made the condition, so
    the answer is set under one lock and the caller woken by its own."""
    streamer = closing(ThreadedStreamer(lambda batch: [x * 2 for x in batch], batch_size=8, max_latency=0.01))
    futures = [streamer.submit([i]) for i in range(20)]
    assert [future.result(5) for future in futures] == [[2 * i] for i in range(20)]
    assert not [future for future in futures if "_condition" in vars(future)]
