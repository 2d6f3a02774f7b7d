"""Many threads at once: every caller gets exactly its own results."""

from __future__ import annotations

import threading

import pytest

from streamer_core import Streamer, ThreadedStreamer
from tests.core import models

THREADS = 64


def hammer(streamer, calls_per_thread: int) -> None:
    errors = []

    def client(k: int) -> None:
        try:
            for i in range(calls_per_thread):
                x = k * 1_000_000 + i
                if i % 10 == 0:  # now and then a multi-item call
                    assert streamer.predict([x, -x, x + 1]) == [2 * x, -2 * x, 2 * x + 2]
                else:
                    assert streamer.submit([x]).result() == [2 * x]
        except BaseException as exc:  # reported below, with the thread
            errors.append((k, exc))

    threads = [threading.Thread(target=client, args=(k,)) for k in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not any(t.is_alive() for t in threads), "a client thread hung"
    assert not errors, errors[:3]


@pytest.mark.parametrize(
    "make",
    [
        pytest.param(lambda: ThreadedStreamer(models.double, batch_size=64, max_latency=0.01), id="thread"),
        pytest.param(lambda: Streamer(models.double, batch_size=64, max_latency=0.01, worker_num=2), id="process"),
    ],
)
def test_64_threads_times_1000_calls_each(closing, make):
    streamer = closing(make())
    hammer(streamer, 1000)


def test_threads_waiting_on_one_call_all_wake_whoever_looks_at_a_client(closing, monkeypatch) -> None:
    """A view's thread waits as the web layers do, looking at its client
    between waits (``wait_call``), while other threads wait in ``result()``
    on the same call: each gets the result as soon as it is in, whichever of
    them the completion wakes first (each wait lets the next waiter through).
    The view's thread waits first here, and long, so the completion wakes it
    before the others."""
    import socket
    import time

    from streamer_core.web import peer

    monkeypatch.setattr(peer, "FIRST_LOOK_S", 5.0)
    gate = threading.Event()

    def gated(batch):
        gate.wait(10)
        return [x * 2 for x in batch]

    streamer = closing(ThreadedStreamer(gated, batch_size=8, max_latency=0.01))
    open_sockets = [socket.socketpair() for _ in range(4)]
    futures = [streamer.submit([i], timeout=4) for i in range(4)]
    got = []

    def wait(call: int, looks: bool) -> None:
        future = futures[call]
        got.append((call, peer.wait_call(future, open_sockets[call][0]) if looks else future.result()))

    views = [threading.Thread(target=wait, args=(call, True)) for call in range(4)]
    readers = [threading.Thread(target=wait, args=(call, False)) for call in range(4) for _ in range(2)]
    for waiter in views:
        waiter.start()
    time.sleep(0.1)
    for waiter in readers:
        waiter.start()
    time.sleep(0.1)
    started = time.monotonic()
    gate.set()
    for waiter in views + readers:
        waiter.join(10)
    answered = time.monotonic() - started
    for ours, theirs in open_sockets:
        ours.close()
        theirs.close()
    assert sorted(got) == sorted((call, [2 * call]) for call in range(4) for _ in range(3))
    assert answered < 2.5, f"a waiter slept {answered:.2f}s after the results were in"
