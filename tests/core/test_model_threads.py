"""The thread backend's ``model_threads``: batches run at once, each on a
thread of its own, one model shared."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, List

import pytest

from streamer_core import ThreadedStreamer
from streamer_core.backends.thread import _ThreadBackend
from streamer_core.batching.scheduler import Scheduler
from streamer_core.options.config import BatchingConfig


def _answer_all(streamer: ThreadedStreamer, n: int, callers: int = 16) -> List[Any]:
    with ThreadPoolExecutor(callers) as pool:
        return list(pool.map(lambda i: streamer.predict([i]), range(n), timeout=60))


def test_batches_run_at_once_on_as_many_threads(closing) -> None:
    # Each batch waits until another runs beside it: one model thread would
    # leave every batch to the barrier's timeout.
    together = threading.Barrier(2, timeout=5)

    def predict(batch: List[int]) -> List[int]:
        together.wait()
        return [x * 2 for x in batch]

    streamer = closing(ThreadedStreamer(predict, batch_size=1, max_latency=0.0, model_threads=2))
    for start in range(0, 20, 2):  # two calls at a time, each a batch of its own
        with ThreadPoolExecutor(2) as pool:
            answers = list(pool.map(lambda i: streamer.predict([i]), range(start, start + 2), timeout=30))
        assert answers == [[2 * start], [2 * start + 2]]
    assert streamer.stats().workers_live == 2


def test_never_more_batches_at_once_than_threads(closing) -> None:
    running = 0
    most = 0
    lock = threading.Lock()

    def predict(batch: List[int]) -> List[int]:
        nonlocal running, most
        with lock:
            running += 1
            most = max(most, running)
        time.sleep(0.01)  # a device call: the GIL is free meanwhile
        with lock:
            running -= 1
        return [x + 1 for x in batch]

    streamer = closing(ThreadedStreamer(predict, batch_size=4, max_latency=0.005, model_threads=3))
    assert _answer_all(streamer, 600, callers=32) == [[i + 1] for i in range(600)]
    assert most == 3
    # Every thread is free again: a lone call goes at once, not after the
    # queue's wait for companions.
    slow = closing(ThreadedStreamer(predict, batch_size=64, max_latency=5.0, model_threads=3))
    assert _answer_all(slow, 400, callers=48) == [[i + 1] for i in range(400)]
    time.sleep(0.2)  # no caller just answered is on its way back
    started = time.monotonic()
    assert slow.predict([7]) == [8]
    assert time.monotonic() - started < 1.5


def test_a_batch_for_a_thread_that_finished_meanwhile_goes_back_to_the_queue() -> None:
    """The dispatcher counted a thread holding one batch, but it finished it
    before the next came: the batch is queued again, not lost or doubled."""
    config = BatchingConfig(batch_size=4, max_latency=0.01)
    scheduler = Scheduler(config)
    backend = _ThreadBackend(lambda batch: batch, config, "m", threads=2)
    backend.start(scheduler)
    try:
        future = scheduler.put([1, 2, 3], 10.0)
        handout = scheduler.next_batch()
        assert handout is not None
        items, held = handout
        assert held == 0
        backend.run(items, 1)  # no thread holds one batch
        assert scheduler.queued() == 3
        again = scheduler.next_batch()
        assert again is not None
        backend.run(*again)
        assert future.result(timeout=10) == [1, 2, 3]
    finally:
        backend.stop(time.monotonic() + 5)
        scheduler.stop(lambda: RuntimeError("stopped"))


def test_one_thread_s_failing_batch_leaves_the_others_serving(closing) -> None:
    def predict(batch: List[int]) -> List[int]:
        if -1 in batch:
            raise ValueError("no negative ones")
        time.sleep(0.005)
        return [x * 3 for x in batch]

    streamer = closing(ThreadedStreamer(predict, batch_size=4, max_latency=0.005, model_threads=2))
    with ThreadPoolExecutor(16) as pool:
        bad = pool.submit(streamer.predict, [-1])
        good = list(pool.map(lambda i: streamer.predict([i]), range(100), timeout=60))
    with pytest.raises(ValueError, match="no negative ones"):
        bad.result(timeout=30)
    assert good == [[3 * i] for i in range(100)]
    assert streamer.stats().workers_live == 2


def test_close_stops_every_thread_and_says_which_are_still_inside(caplog) -> None:
    release = threading.Event()
    inside = threading.Barrier(3, timeout=10)

    def predict(batch: List[int]) -> List[int]:
        inside.wait()
        release.wait(10)
        return batch

    streamer = ThreadedStreamer(predict, batch_size=1, max_latency=0.0, model_threads=2)
    calls = [streamer.submit([i]) for i in range(2)]
    inside.wait()  # both threads are in the model
    with caplog.at_level(logging.WARNING, logger="streamer_core"):
        streamer.close(timeout=0.3)
    release.set()
    assert any("2 model threads are still inside the model" in r.getMessage() for r in caplog.records)
    for call in calls:
        call.exception(timeout=10)
    # Free threads each end at once: none is left waiting for a batch.
    before = set(threading.enumerate())
    free = ThreadedStreamer(lambda batch: batch, batch_size=1, max_latency=0.0, model_threads=3)
    assert free.predict([1]) == [1]
    assert free.stats().workers_live == 3
    mine = [t for t in set(threading.enumerate()) - before if t.name.startswith("streamer-thread-model")]
    assert len(mine) == 3, mine
    caplog.clear()
    started = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="streamer_core"):
        free.close(timeout=5)
    assert time.monotonic() - started < 2.0
    assert not [t for t in mine if t.is_alive()]
    assert not any("inside the model" in r.getMessage() for r in caplog.records)


def test_the_ready_line_says_how_many_batches_at_once(closing, caplog) -> None:
    with caplog.at_level(logging.INFO, logger="streamer_core"):
        closing(ThreadedStreamer(lambda batch: batch, batch_size=8, max_latency=0.01, model_threads=2))
    assert any(r.getMessage().endswith("2 batches at once)") for r in caplog.records)


@pytest.mark.parametrize("value", [0, -1, 1.5, "2"])
def test_a_wrong_count_is_refused_at_once(value: Any) -> None:
    with pytest.raises((TypeError, ValueError), match="model_threads must be a whole number >= 1"):
        ThreadedStreamer(lambda batch: batch, batch_size=8, model_threads=value)


SCRIPT = Path(__file__).with_name("scripts") / "gevent_model_threads.py"


def test_under_gevent_every_model_thread_runs_at_once() -> None:
    """Patched, the model threads are greenlets whose calls run on gevent's
    pool of real threads, 10 of them by default: the pool grows so that 12
    batches run at once."""
    pytest.importorskip("gevent")
    done = subprocess.run([sys.executable, str(SCRIPT), "12"], capture_output=True, text=True, timeout=90)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["results"] == [[2 * i] for i in range(24)]
    assert report["most_at_once"] == 12
