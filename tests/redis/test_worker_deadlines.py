"""A worker and the deadlines of the requests it reads: one that no batch
can answer in time is answered ``StreamerTimeoutError`` at once, unrun,
and requests that expire in the worker's hands never stop it reading."""

from __future__ import annotations

import threading
import time
from typing import Any, List

import pytest

from streamer_core import StreamerTimeoutError
from streamer_core.backends.redis.intake import Input, ServerClock
from streamer_core.backends.redis.reader import Handover, Reader
from streamer_core.backends.redis.wire import Request
from streamer_core.options.config import BatchingConfig


class Slow:
    """A model whose every batch takes ``seconds``, recording what it ran."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.ran: List[Any] = []
        self._lock = threading.Lock()

    def __call__(self, batch: List[Any]) -> List[Any]:
        with self._lock:
            self.ran.extend(batch)
        time.sleep(self.seconds)
        return [f"ok:{x}" for x in batch]


def test_a_request_no_batch_can_answer_in_time_is_answered_at_once_unrun(broker, make_streamer, start_worker):
    model = Slow(0.6)
    worker = start_worker(broker, model, batch_size=1, max_latency=0.01)
    streamer = make_streamer(broker, timeout=10)
    for i in range(3):  # the worker learns how long a batch takes
        assert streamer.predict([f"warm{i}"]) == [f"ok:warm{i}"]
    first = streamer.submit(["first"])
    time.sleep(0.1)
    sent = time.monotonic()
    doomed = streamer.submit(["doomed"], timeout=0.9)  # about 0.4 s left when the first batch ends
    with pytest.raises(StreamerTimeoutError) as caught:
        doomed.result(5)
    waited = time.monotonic() - sent
    assert "it was not run" in str(caught.value), f"the web process timed it out itself after {waited:.2f}s"
    assert first.result(5) == ["ok:first"]
    assert model.ran == ["warm0", "warm1", "warm2", "first"]
    assert worker.worker.stats().dropped["expired"] == 1


def test_requests_that_expire_in_a_busy_workers_hands_do_not_stop_it_reading(broker, make_streamer, start_worker):
    """Those that expire while the worker holds a full batch ahead leave it
    room to read again: the next request is answered, not stranded."""
    model = Slow(0.3)
    worker = start_worker(broker, model, batch_size=2, max_latency=0.01)
    streamer = make_streamer(broker, timeout=10)
    running = streamer.submit(["run0", "run1"])  # one batch
    deadline = time.monotonic() + 5
    while not model.ran and time.monotonic() < deadline:
        time.sleep(0.005)
    assert model.ran, "the first batch never started"
    # The next batch, read ahead: it expires before the model is free.
    expiring = [streamer.submit([f"expire{i}"], timeout=0.1) for i in range(2)]
    for call in expiring:
        with pytest.raises(StreamerTimeoutError):
            call.result(5)
    assert running.result(5) == ["ok:run0", "ok:run1"]
    after = streamer.submit(["after"], timeout=5)
    assert after.result(6) == ["ok:after"], "the worker stopped reading"
    assert "expire0" not in model.ran and "expire1" not in model.ran
    assert worker.worker.stats().dropped["expired"] == 2


def test_the_reader_waiting_for_room_is_woken_when_what_it_held_expires(broker):
    """The race behind the test above, made certain: the reader waits for
    room beside a full read-ahead when the model's thread finds all of it
    expired. Taking it out must wake the reader (else neither thread would
    ever move again: the model's waits for something to read)."""
    import redis

    handover = Handover(BatchingConfig(2, 0.01))
    handover.clock = ServerClock(redis.Redis.from_url(broker.url))
    created_ms = int(handover.clock.now_ms())
    handover.add([Input(_request(created_ms, i), f"x{i}") for i in range(2)])  # a full read-ahead
    stopping = threading.Event()
    reader = Reader(None, None, None, "c", None, handover, BatchingConfig(2, 0.01), lambda: True, None, stopping)
    waiting, woken = threading.Event(), threading.Event()

    def read() -> None:
        with handover.cond:
            waiting.set()
            reader._wait_for_room()
        woken.set()

    thread = threading.Thread(target=read, daemon=True)
    thread.start()
    try:
        assert waiting.wait(5)
        time.sleep(0.1)  # both past their 50 ms deadline
        with handover.cond:  # the reader waits now: it let go of the lock
            pass
        assert handover.take(stopping) == ([], False), "expired requests are not a batch"
        assert len(handover.take_expired()) == 2
        assert woken.wait(2), "the reader was left waiting for room it has"
    finally:
        stopping.set()
        with handover.cond:
            handover.cond.notify_all()
        thread.join(5)


def _request(created_ms: int, index: int) -> Request:
    return Request(f"{created_ms}-{index}".encode(), "web", b"%d" % index, 50, "msgpack", b"", (), 1)
