"""Knowing whether any worker is alive: workers beat into a set in Redis, by
the server's clock; a web process created with ``require_workers=True`` (as
the Flask and Django layers do) refuses calls at once while none is alive,
rather than leaving them to wait out their timeout."""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from typing import Any, List

import pytest
import redis

from streamer_core import NoWorkerError, StreamerTimeoutError, UnavailableError
from streamer_core.backends.redis.roster import NO_WORKER_S, Roster
from streamer_core.backends.redis.wire import BEAT_SCRIPT, PRESENCE_TTL_MS, Keys
from tests.core import models
from tests.helpers import wait_for
from tests.servers import free_port


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


def test_the_first_call_after_a_worker_comes_up_is_served_not_refused(broker, make_streamer, start_worker):
    """The web process looks at the workers once a second; a call refused
    for want of them asks Redis again first, so that the first callers
    after a worker finishes loading are not told it is loading (seen on a
    fresh clone: a 503 0.2 s after the worker said it was ready)."""
    streamer = make_streamer(broker, require_workers=True, timeout=10)
    with pytest.raises(NoWorkerError):
        streamer.predict([1])
    workers_key = f"streamer:{broker.prefix}:workers"
    for round_ in range(2):
        time.sleep(0.1)  # past the last refusal's look at Redis (roster.RECHECK_S)
        worker = start_worker(broker, models.double, batch_size=8)
        assert wait_for(lambda: broker.conn.zcard(workers_key) > 0, 10, interval=0.002)
        assert streamer.predict([round_]) == [2 * round_], f"round {round_}: refused though a worker is live"
        worker.stop()
        broker.conn.delete(workers_key)
        assert wait_for(lambda: _refused(streamer), 8), "calls still queued with no worker alive"


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


def test_a_killed_worker_is_taken_for_dead_after_its_beats_stop(broker, make_streamer, procs):
    """A worker process SIGKILLed cannot leave the set; its beat gets old, and
    within the presence window (3 s) it no longer counts: calls are refused."""
    worker = procs.worker(broker, "identity")
    streamer = make_streamer(broker, require_workers=True, timeout=10)
    assert streamer.wait_ready(30), procs.log(worker)
    assert streamer.predict([1]) == [1]
    os.kill(worker.pid, signal.SIGKILL)
    worker.wait(5)
    killed = time.monotonic()
    assert wait_for(lambda: streamer.live_workers() == 0, 6), "a dead worker kept counting as alive"
    assert time.monotonic() - killed < 5.0
    assert wait_for(lambda: _refused(streamer), 6), "calls still accepted with no worker alive"


def test_a_beat_older_than_the_presence_window_does_not_count(broker, make_streamer):
    conn = broker.conn
    seconds, micros = conn.time()
    now_ms = seconds * 1000 + micros // 1000
    conn.zadd(f"streamer:{broker.prefix}:workers", {"gone-worker": now_ms - 10_000, "fresh-worker": now_ms})
    streamer = make_streamer(broker, require_workers=True)
    assert streamer.live_workers() == 1


def test_when_the_last_worker_stops_under_load_waiting_calls_fail_as_new_ones_do(broker, make_streamer, start_worker):
    """The last worker stops (SIGTERM: it finishes the batches in hand) with
    calls still queued. Those calls do not wait out their 20 s timeout: once
    no worker has been alive for the grace period, they fail as a new call
    does, with NoWorkerError (a 503), and what they queued is deleted, so a
    worker that starts later runs none of it."""
    ran: List[Any] = []
    first_batch = threading.Event()

    def slow(batch: List[Any]) -> List[Any]:
        ran.extend(batch)
        first_batch.set()
        time.sleep(0.2)
        return [x * 2 for x in batch]

    worker = start_worker(broker, slow, batch_size=2, claim_after=0.5)
    streamer = make_streamer(broker, require_workers=True, timeout=20)
    assert streamer.wait_ready(10)
    futures = [streamer.submit([n]) for n in range(40)]
    assert first_batch.wait(5)
    worker.worker.stop()
    stopped = time.monotonic()
    outcomes = []
    for n, future in enumerate(futures):
        try:
            outcomes.append(future.result(15) == [n * 2])
        except NoWorkerError as exc:
            outcomes.append(str(exc))
    waited = time.monotonic() - stopped
    answered = [n for n, outcome in enumerate(outcomes) if outcome is True]
    failed = [outcome for outcome in outcomes if outcome is not True]
    assert answered and failed, f"the test should stop the worker mid-load: {outcomes}"
    assert answered == list(range(len(answered))), "the batches in hand are finished, in order"
    assert waited < 10.0, f"waiting calls took {waited:.1f}s to fail: they waited for their timeout"
    with pytest.raises(NoWorkerError) as new_call:
        streamer.predict([99])
    assert set(failed) == {str(new_call.value)}, "a waiting call and a new one fail alike"
    assert wait_for(lambda: broker.xlen() == 0, 3), "the failed calls' requests must be deleted"
    ran_before = list(ran)
    start_worker(broker, slow, batch_size=2, claim_after=0.5)
    assert wait_for(lambda: streamer.live_workers() == 1, 10)
    assert wait_for(lambda: _served_value(streamer, 7) == [14], 10)
    assert ran[len(ran_before) :] == [7], f"a new worker ran calls given up on: {ran[len(ran_before) :]}"


def _served_value(streamer: Any, x: int) -> Any:
    try:
        return streamer.predict([x])
    except NoWorkerError:
        return None


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


def test_a_worker_whose_model_hangs_stops_showing_itself_alive_until_it_returns(broker, make_streamer, start_worker):
    # Run in a thread of this process, a hung worker cannot exit: it stops
    # beating (and claiming its requests, for other workers to take over).
    release = threading.Event()

    def model(batch: list) -> list:
        if "hang" in batch:
            release.wait(30)
        return [x.upper() for x in batch]

    start_worker(broker, model, batch_size=4, hang_timeout=0.5)
    streamer = make_streamer(broker)
    assert streamer.predict(["a"]) == ["A"]
    # Its beats come every 0.125 s here; a loaded machine may delay one.
    assert wait_for(lambda: streamer.live_workers() == 1, 10), "a worker that answers should count as alive"
    with pytest.raises(StreamerTimeoutError):
        streamer.predict(["hang"], timeout=1)
    assert wait_for(lambda: streamer.live_workers() == 0, 10), "a hung worker kept counting as alive"
    release.set()
    assert wait_for(lambda: streamer.live_workers() == 1, 10), "the worker did not come back when its model returned"
    assert streamer.predict(["b"]) == ["B"]


def test_a_long_batch_whose_caller_still_waits_is_not_taken_for_hung(broker, make_streamer, start_worker, caplog):
    """Hung means one batch ran hang_timeout or more and none of its callers
    waits any more: a batch running well past hang_timeout (0.5 s) for a
    caller who waits 30 s is no hang. The worker keeps beating (and claiming
    its requests) all along, and the caller gets its answer."""
    entered, release = threading.Event(), threading.Event()

    def model(batch: list) -> list:
        if "slow" in batch:
            entered.set()
            release.wait(30)
        return [x.upper() for x in batch]

    start_worker(broker, model, batch_size=4, hang_timeout=0.5)
    streamer = make_streamer(broker, timeout=30)
    assert streamer.predict(["a"]) == ["A"]
    assert wait_for(lambda: streamer.live_workers() == 1, 10), "a worker that answers should count as alive"
    with caplog.at_level(logging.ERROR, logger="streamer_core.redis"):
        slow = streamer.submit(["slow"])
        try:
            assert entered.wait(10)
            # Past hang_timeout, then past the live window a worker that stopped beating leaves.
            deadline = time.monotonic() + 0.5 + 3.5
            while time.monotonic() < deadline:
                assert streamer.live_workers() == 1, "a worker whose caller still waits stopped showing itself alive"
                time.sleep(0.1)
        finally:
            release.set()
        assert slow.result(10) == ["SLOW"]
    hung = [r.getMessage() for r in caplog.records if "taken for hung" in r.getMessage()]
    assert not hung, "taken for hung while its caller waited"


def test_the_time_redis_cannot_be_asked_does_not_count_as_time_without_workers(broker):
    """The roster (what a web process knows of its workers) takes no
    answer from Redis for no news: while Redis cannot be asked, calls are
    not refused for want of workers, and once it answers again (a restart
    or a failover may have left no beat there yet) the workers have
    NO_WORKER_S to be seen before they are."""
    keys = Keys(broker.prefix)
    roster = Roster(keys, require_workers=True)
    with redis.Redis.from_url(broker.url) as conn:
        conn.eval(BEAT_SCRIPT, 1, keys.workers, "w1", PRESENCE_TTL_MS)
        assert roster.check(conn) == 1
        assert not roster.missing()
        conn.delete(keys.workers)  # a worker that beat long ago, as a restarted server shows it: never
        with redis.Redis(port=free_port(), socket_connect_timeout=1) as nobody:
            with pytest.raises(redis.ConnectionError):
                roster.check(nobody)
        roster._seen -= 60  # a minute without an answer
        assert not roster.missing(), "Redis not answering is no sign that no worker runs"
        assert roster.check(conn) == 0
        assert not roster.missing(), "the workers must be given NO_WORKER_S to be seen again"
        roster._seen -= NO_WORKER_S + 0.1
        assert roster.missing()
        assert "start workers" in str(roster.error())
