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
