"""Knowing whether any worker is alive: workers beat into a set in Redis, by
the server's clock; a web process created with ``require_workers=True`` (as
the Flask and Django layers do) refuses calls at once while none is alive,
rather than leaving them to wait out their timeout."""

from __future__ import annotations

import time

import pytest

from streamer_core import NoWorkerError, UnavailableError
from tests.core import models
from tests.helpers import wait_for


def test_without_a_worker_calls_are_refused_at_once(broker, make_streamer):
    streamer = make_streamer(broker, require_workers=True, timeout=10)
    assert streamer.live_workers() == 0
    started = time.monotonic()
    with pytest.raises(NoWorkerError, match="start workers") as info:
        streamer.predict([1])
    assert time.monotonic() - started < 1.0, "the call waited instead of being refused"
    assert isinstance(info.value, UnavailableError)  # a 503 for the web layers
    assert broker.xlen() == 0, "a refused call must not be queued"
    assert streamer.wait_ready(0.3) is False


def test_a_worker_is_seen_and_its_exit_is_noticed(broker, make_streamer, start_worker):
    streamer = make_streamer(broker, require_workers=True, timeout=10)
    worker = start_worker(broker, models.double, batch_size=8)
    assert streamer.wait_ready(10), "the worker never announced itself"
    assert streamer.live_workers() == 1
    assert wait_for(lambda: _served(streamer), 5) == [4]
    worker.stop()
    assert streamer.live_workers() == 0, "a worker that stopped must leave the set"
    # Within a few seconds of the last worker leaving, calls are refused.
    assert wait_for(lambda: _refused(streamer), 8), "calls still queued with no worker alive"


def test_a_killed_worker_is_taken_for_dead_after_its_beats_stop(broker, make_streamer):
    """A worker that dies without leaving stays in the set, but its beat gets
    old: after the presence window it no longer counts."""
    conn = broker.conn
    seconds, micros = conn.time()
    now_ms = seconds * 1000 + micros // 1000
    conn.zadd(f"streamer:{broker.prefix}:workers", {"gone-worker": now_ms - 10_000, "fresh-worker": now_ms})
    streamer = make_streamer(broker, require_workers=True)
    assert streamer.live_workers() == 1


def test_by_default_calls_wait_for_a_worker_to_come(broker, make_streamer, start_worker):
    """service_streamer's behaviour stays the default: the call is queued and
    answered when a worker starts."""
    streamer = make_streamer(broker, timeout=10)
    future = streamer.submit([5])
    broker.wait_queued(1)
    start_worker(broker, models.double, batch_size=8)
    assert future.result(10) == [10]


def _served(streamer):
    try:
        return streamer.predict([2])
    except NoWorkerError:
        return None


def _refused(streamer):
    try:
        streamer.submit([3]).cancel()
    except NoWorkerError:
        return True
    return False
