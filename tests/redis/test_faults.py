"""Redis itself misbehaving: connections killed under the clients, the
server restarted empty, the server not there at all. Each test has a
private redis-server (``fault_broker``); the shared one is never touched."""

from __future__ import annotations

import functools
import os
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace

import pytest

from streamer_core import (
    BrokerUnavailableError,
    NoWorkerError,
    RedisStreamer,
    RedisWorker,
    StreamerError,
    StreamerTimeoutError,
    UnavailableError,
)
from streamer_core.backends.redis.client import SEND_RETRY_S
from streamer_core.backends.redis.roster import NO_WORKER_S
from tests.redis import models
from tests.redis.conftest import ThreadWorker, outcomes_of, wait_for


def slow_double(batch: list) -> list:
    time.sleep(0.1)
    return [x * 2 for x in batch]


def test_calls_in_flight_survive_killed_connections(fault_broker, make_streamer, start_worker):
    """CLIENT KILL drops every client connection (web side and workers) while
    calls are queued, running and being answered: every call still gets its
    own answer."""
    start_worker(fault_broker, slow_double, batch_size=4)
    streamer = make_streamer(fault_broker, timeout=15)
    with ThreadPoolExecutor(8) as pool:
        futures = [pool.submit(streamer.predict, [x]) for x in range(40)]
        killed = 0
        for _ in range(6):
            time.sleep(0.15)
            killed += fault_broker.conn.client_kill_filter(_type="normal", skipme=True)
        results = [f.result(20) for f in futures]
    assert killed >= 6, "the test should have killed connections"
    assert results == [[x * 2] for x in range(40)]
    assert streamer.predict([1]) == [2]


def test_answers_written_while_the_web_side_is_disconnected_are_not_lost(fault_broker, make_streamer, start_worker):
    """The web process's reading connection is killed just as its answers are
    written: results wait in its stream until it reads again."""
    release = threading.Event()

    def model(batch: list) -> list:
        assert release.wait(10)
        return [x * 2 for x in batch]

    start_worker(fault_broker, model, batch_size=8, max_latency=0.05)
    streamer = make_streamer(fault_broker, timeout=15)
    futures = [streamer.submit([x]) for x in range(5)]
    fault_broker.wait_queued(5)
    time.sleep(0.2)
    for _ in range(3):
        fault_broker.conn.client_kill_filter(_type="normal", skipme=True)
        time.sleep(0.05)
    release.set()
    fault_broker.conn.client_kill_filter(_type="normal", skipme=True)
    assert [f.result(10) for f in futures] == [[x * 2] for x in range(5)]


def test_clients_and_workers_reconnect_after_a_redis_restart(fault_broker, make_streamer, start_worker):
    worker = start_worker(fault_broker, models.double, batch_size=4)
    streamer = make_streamer(fault_broker, timeout=10)
    assert streamer.predict([1]) == [2]
    fault_broker.server.restart(down_for=0.5)
    started = time.monotonic()
    assert streamer.predict([2, 3], timeout=10) == [4, 6]
    assert time.monotonic() - started < 8
    with ThreadPoolExecutor(4) as pool:
        assert list(pool.map(lambda x: streamer.predict([x]), range(20))) == [[x * 2] for x in range(20)]
    assert worker.alive() and worker.error is None


def test_calls_queued_when_redis_restarts_are_sent_again_and_answered(fault_broker, make_streamer, start_worker):
    """Calls waiting in Redis for a worker when the server restarts empty are
    sent again by the web process: each gets its answer within a bounded
    time, never a hang."""
    streamer = make_streamer(fault_broker, timeout=12)
    futures = [streamer.submit([x]) for x in range(6)]
    fault_broker.wait_queued(6)
    fault_broker.server.restart(down_for=0.5)
    start_worker(fault_broker, models.double, batch_size=4)
    started = time.monotonic()
    outcomes = outcomes_of(futures, 15)  # a clear error is allowed
    assert time.monotonic() - started < 15, "calls in flight across a restart must not hang"
    assert outcomes == [[x * 2] for x in range(6)], "the web side should have sent the lost requests again"


def test_a_worker_running_a_batch_when_redis_restarts_keeps_serving(fault_broker, make_streamer, start_worker, gate):
    """Redis restarts empty while the model runs: the worker answers, recreates
    its consumer group and keeps serving. (Once, NOGROUP from XAUTOCLAIM
    escaped run_forever and the worker died.)"""
    worker = start_worker(fault_broker, gate, batch_size=4, claim_after=0.5)
    streamer = make_streamer(fault_broker, timeout=15)
    held = streamer.submit(["hold"])
    assert gate.entered.wait(5)
    queued = [streamer.submit([f"q{i}"]) for i in range(3)]
    fault_broker.wait_queued(4)
    fault_broker.server.restart(down_for=0.3)
    time.sleep(0.5)  # the batch outlives the restart by more than claim_after / 2
    gate.release()
    assert held.result(10) == ["ok:hold"]
    assert not wait_for(lambda: not worker.alive(), 1.5), f"the worker died: {worker.error}"
    assert outcomes_of(queued, 10) == [["ok:q0"], ["ok:q1"], ["ok:q2"]]
    assert streamer.predict(["after"]) == ["ok:after"]


def test_calls_fail_fast_and_clearly_while_redis_is_down(fault_broker, make_streamer, start_worker):
    worker = start_worker(fault_broker, models.double, batch_size=4)
    streamer = make_streamer(fault_broker, timeout=20)
    assert streamer.predict([1]) == [2]
    fault_broker.server.kill()
    started = time.monotonic()
    with pytest.raises(BrokerUnavailableError):
        streamer.predict([2])
    assert time.monotonic() - started < 5, "an unreachable Redis must not make a call wait out its timeout"
    fault_broker.server.start()
    errors: list = []
    assert wait_for(lambda: _answers(streamer, errors), 20), (
        f"calls should succeed again once Redis is back; got {errors}; "
        f"worker alive: {worker.alive()} ({worker.error!r})"
    )


def test_a_call_redis_refuses_half_way_fails_fast_and_the_streamer_goes_on(fault_broker, make_streamer, start_worker):
    """Redis out of memory (``maxmemory``, no eviction) refuses writes with
    an error reply, not a lost connection. A call of 511 inputs goes in two
    sends (its worker's batches hold 256, two of which may be out at once:
    test_large_calls), the first fits, the second is refused. The call fails at once
    with a clear error (its sent inputs withdrawn), and the streamer serves
    again once Redis has room. (The refusal once escaped the backend and
    left the dispatcher's counts wrong; with the first inputs sent, failing
    the call also deadlocked the dispatcher on the backend's own lock.)"""
    conn = fault_broker.conn
    holding = threading.Event()  # the worker holds the batch it reads until the end
    start_worker(fault_broker, lambda batch: holding.wait(20) and [x * 2 for x in batch], batch_size=256)
    streamer = make_streamer(fault_broker, timeout=30)
    assert streamer.wait_ready(10)  # and counts the worker's batch size
    assert streamer.predict([], timeout=1) == []
    # Redis refuses a script whose start finds memory over the limit (its
    # writes then all fail, or all succeed). Each send of 4 KB inputs holds
    # about 1 MB while it is read: the first starts 1 MB over what Redis used
    # before, the second 2 MB over (the first send's entries, and itself).
    used = int(conn.info("memory")["used_memory"])
    conn.config_set("maxmemory-policy", "noeviction")
    conn.config_set("maxmemory", used + 1_600_000)
    started = time.monotonic()
    with pytest.raises(BrokerUnavailableError, match="maxmemory"):
        streamer.predict(["x" * 4096] * 511)
    assert time.monotonic() - started < 10, "a refused call must not wait out its timeout"
    assert wait_for(lambda: fault_broker.xlen() == 0, 5), "the inputs sent before the refusal must be withdrawn"
    holding.set()
    conn.config_set("maxmemory", 0)
    start_worker(fault_broker, models.double, batch_size=8)
    assert streamer.predict([1, 2, 3], timeout=10) == [2, 4, 6]
    streamer.close(timeout=5)


def test_a_send_redis_refuses_for_a_moment_is_retried_and_answered(fault_broker, make_streamer, start_worker):
    """A blip shorter than SEND_RETRY_S (here Redis refusing every write,
    out of memory, for 0.3 s) costs a call nothing: its send is tried again
    until Redis takes it, and it is answered."""
    conn = fault_broker.conn
    start_worker(fault_broker, models.double, batch_size=4)
    streamer = make_streamer(fault_broker, timeout=15)
    assert streamer.predict([1]) == [2]
    conn.config_set("maxmemory-policy", "noeviction")
    conn.config_set("maxmemory", 1)
    lifted = threading.Timer(0.3, conn.config_set, ("maxmemory", 0))
    lifted.start()
    try:
        assert streamer.predict([21, 22]) == [42, 44]
    finally:
        lifted.join()


def test_a_send_redis_keeps_refusing_fails_after_send_retry_s(fault_broker, make_streamer):
    """Redis refusing writes for good: a call fails with
    BrokerUnavailableError once its send has been tried for SEND_RETRY_S
    from its arrival (not at the first refusal, and not after its timeout)."""
    conn = fault_broker.conn
    streamer = make_streamer(fault_broker, timeout=30)
    assert streamer.predict([]) == []
    conn.config_set("maxmemory-policy", "noeviction")
    conn.config_set("maxmemory", 1)
    started = time.monotonic()
    with pytest.raises(BrokerUnavailableError, match="not queued"):
        streamer.predict([1])
    took = time.monotonic() - started
    conn.config_set("maxmemory", 0)
    assert SEND_RETRY_S - 0.05 <= took < SEND_RETRY_S + 5, f"refused after {took:.2f}s"


def test_a_call_behind_another_sends_retries_is_refused_within_send_retry_s_of_its_own_arrival(
    fault_broker, make_streamer
):
    """Sends go one after another: a call that arrives while another's send
    retries waits for it. Its own send gives up SEND_RETRY_S after the call
    arrived, not after its send began, so every refusal comes within that
    bound (they came after 2.3 to 3 s)."""
    conn = fault_broker.conn
    streamer = make_streamer(fault_broker, timeout=30)
    assert streamer.predict([]) == []
    conn.config_set("maxmemory-policy", "noeviction")
    conn.config_set("maxmemory", 1)
    try:
        first = streamer.submit([1])
        time.sleep(0.3)  # the first send retries until 1.5 s: this call waits 1.2 s for it
        started = time.monotonic()
        with pytest.raises(BrokerUnavailableError):
            streamer.predict([2])
        took = time.monotonic() - started
        with pytest.raises(BrokerUnavailableError):
            first.result(10)
    finally:
        conn.config_set("maxmemory", 0)
    assert took < SEND_RETRY_S + 0.6, f"refused {took:.2f}s after it arrived"  # counted from its send: 2.7 s


def test_while_redis_is_down_calls_blame_redis_not_missing_workers(fault_broker, make_streamer, start_worker):
    """With ``require_workers`` (as the web layers make it), Redis down for
    longer than NO_WORKER_S: every call refused meanwhile is refused with
    BrokerUnavailableError, never with a NoWorkerError telling the user to
    start workers that are running; once Redis is back, calls are answered
    (the workers are given NO_WORKER_S to be seen again)."""
    start_worker(fault_broker, models.double, batch_size=4)
    streamer = make_streamer(fault_broker, timeout=10, require_workers=True)
    assert streamer.wait_ready(10)
    assert streamer.predict([1]) == [2]
    fault_broker.server.kill()
    refusals = []
    down_until = time.monotonic() + NO_WORKER_S + 1.5
    while time.monotonic() < down_until:
        with pytest.raises(UnavailableError) as raised:
            streamer.predict([2])
        refusals.append(raised.value)
    fault_broker.server.start()
    assert len(refusals) >= 2
    assert all(type(error) is BrokerUnavailableError for error in refusals), [repr(e) for e in refusals]
    errors: list = []
    assert wait_for(lambda: _answers(streamer, errors), 15), errors
    assert not [e for e in errors if isinstance(e, NoWorkerError)], errors


def test_answers_redis_refuses_for_a_while_are_written_once_it_takes_them(
    fault_broker, make_streamer, start_worker, gate
):
    """Redis out of memory refuses a worker's answers (the whole
    transaction). The worker keeps them and tries again while their caller
    waits, rather than dropping them, which had the batch taken over and run
    again, and again, until the caller's timeout."""
    conn = fault_broker.conn
    start_worker(fault_broker, gate, batch_size=4)
    streamer = make_streamer(fault_broker, timeout=20)
    future = streamer.submit(["hold"])
    assert gate.entered.wait(5)
    conn.config_set("maxmemory-policy", "noeviction")
    conn.config_set("maxmemory", 1)
    gate.release()
    time.sleep(1.5)  # three times the workers' claim_after: a dropped answer's request would be run again by now
    conn.config_set("maxmemory", 0)
    assert future.result(10) == ["ok:hold"]
    assert gate.seen() == ["hold"], "the model ran the batch again"


def test_refused_answers_are_kept_while_any_caller_of_their_batch_waits(
    fault_broker, make_streamer, start_worker, gate
):
    """A batch of two callers, one whose deadline passes while Redis refuses
    the answers: the other still waits, so the worker keeps the batch's
    answers and writes them once Redis takes them, rather than dropping
    them all and having the waiting caller's request run again."""
    conn = fault_broker.conn
    brief = make_streamer(fault_broker, timeout=1.0)
    patient = make_streamer(fault_broker, timeout=20)
    hurried = brief.submit(["x"])
    waiting = patient.submit(["hold"])
    assert wait_for(lambda: fault_broker.xlen() == 2, 5)
    start_worker(fault_broker, gate, batch_size=4)
    assert gate.entered.wait(5)
    assert [sorted(batch) for batch in gate.batches] == [["hold", "x"]], "one batch of both callers"
    conn.config_set("maxmemory-policy", "noeviction")
    conn.config_set("maxmemory", 1)
    try:
        gate.release()
        time.sleep(2.5)  # past the brief caller's deadline, and five times the workers' claim_after
    finally:
        conn.config_set("maxmemory", 0)
    assert waiting.result(10) == ["ok:hold"]
    assert gate.seen().count("hold") == 1, "the model ran the waiting caller's input again"
    with pytest.raises(StreamerTimeoutError):
        hurried.result(5)


def test_a_call_while_redis_is_frozen_fails_by_its_timeout_and_says_so(fault_broker, make_streamer, start_worker):
    """Redis stopped (SIGSTOP), answering nothing: the call fails soon
    after its timeout, as the web layer waits for it (looking at its client
    now and then), and the error names that timeout, not the grace of the
    last wait ("no result within 1s" after 21 s)."""
    start_worker(fault_broker, models.double, batch_size=4)
    streamer = make_streamer(fault_broker, timeout=3)
    assert streamer.predict([1]) == [2]
    assert fault_broker.server.process is not None
    os.kill(fault_broker.server.process.pid, signal.SIGSTOP)
    try:
        started = time.monotonic()
        future = streamer.submit([2])
        while not future._wait_done(0.1):  # as streamer_core.web.peer.wait_call waits
            if time.monotonic() > future._deadline:
                break
        with pytest.raises(StreamerTimeoutError, match=r"did not finish within its timeout of 3s"):
            future.result()
        assert time.monotonic() - started < 6
    finally:
        os.kill(fault_broker.server.process.pid, signal.SIGCONT)


def test_a_user_without_dangerous_commands_can_call(fault_broker, make_streamer, start_worker, caplog):
    """A hardened ACL (``+@all -@dangerous``) refuses INFO, which a web
    process asks for its server's run id, to send again what a restart lost.
    Such a user still makes calls, told once that restarts go unnoticed."""
    fault_broker.conn.acl_setuser(
        "app", enabled=True, passwords=["+s3cret"], keys=["*"], channels=["*"], commands=["+@all", "-@dangerous"]
    )
    start_worker(fault_broker, models.double, batch_size=4)
    host_port = fault_broker.url.split("://", 1)[-1].rsplit("/", 1)[0]
    restricted = SimpleNamespace(url=f"redis://app:s3cret@{host_port}/0", prefix=fault_broker.prefix)
    with caplog.at_level("WARNING", logger="streamer_core.redis"):
        streamer = make_streamer(restricted)
        assert streamer.predict([1, 2], timeout=10) == [2, 4]
        time.sleep(1.5)  # the collector checks the server about once a second
        assert streamer.predict([3], timeout=10) == [6]
    refused = [r for r in caplog.records if "INFO" in r.getMessage()]
    assert len(refused) == 1, [r.getMessage() for r in caplog.records]


def _answers(streamer: RedisStreamer, errors: list) -> bool:
    try:
        return streamer.predict([5], timeout=3) == [10]
    except StreamerError as exc:
        errors.append(exc)
        return False


def test_a_streamer_and_worker_started_before_redis_serve_once_it_is_up(new_server):
    server = new_server()
    worker = ThreadWorker(RedisWorker(models.double, 4, redis_broker=server.url, prefix="early", claim_after=0.5))
    streamer = RedisStreamer(server.url, "early", timeout=10)
    worker.thread.start()
    try:
        started = time.monotonic()
        with pytest.raises(BrokerUnavailableError):
            streamer.predict([1])
        assert time.monotonic() - started < 5
        time.sleep(0.3)
        assert worker.alive(), f"a worker must wait for Redis, not die: {worker.error!r}"
        server.start()
        errors: list = []
        assert wait_for(lambda: _answers(streamer, errors), 20), f"{errors}; worker error: {worker.error!r}"
    finally:
        worker.worker.stop()
        streamer.close(timeout=2)
        worker.thread.join(10)


def test_losing_redis_is_said_once_per_model_naming_it(fault_broker, make_streamer, start_worker, caplog):
    """Two models on one Redis: each web-side collector and each worker says
    it lost Redis, and that Redis is back, once, naming its model's keys, so
    that two routes' lines are told apart."""
    import logging

    caplog.set_level(logging.WARNING, logger="streamer_core")
    first, second = f"{fault_broker.prefix}-a", f"{fault_broker.prefix}-b"
    streamers = []

    def said(prefix, words):
        lines = (r.getMessage() for r in caplog.records)
        return [m for m in lines if m.startswith(f"streamer:{prefix}: ") and words in m]

    for prefix in (first, second):
        start_worker(SimpleNamespace(url=fault_broker.url, prefix=prefix), models.double, batch_size=4)
        streamer = RedisStreamer(fault_broker.url, prefix, timeout=10)
        streamers.append(streamer)
    try:
        assert [s.predict([1]) for s in streamers] == [[2], [2]]
        fault_broker.server.restart(down_for=1.0)
        assert [s.predict([2], timeout=10) for s in streamers] == [[4], [4]]
        for prefix in (first, second):
            assert wait_for(lambda p=prefix: len(said(p, "Redis is reachable again after")) == 2, 5), said(prefix, "")
            lost = said(prefix, "lost Redis")
            # its web-side collector reconnecting and its worker retrying, each said once
            assert sorted(m.rsplit("; ", 1)[1] for m in lost) == ["reconnecting", "retrying"], lost
    finally:
        for streamer in streamers:
            streamer.close()


def test_sending_while_redis_is_down_is_said_once_an_outage(fault_broker, make_streamer, start_worker, caplog):
    """Each call's send is tried again and again for SEND_RETRY_S while
    Redis is down: the web process says that sending fails once an outage,
    and once that it works again, with how many tries failed meanwhile; not
    a line a try (five a call, beside the web layer's 503 line)."""
    import logging

    start_worker(fault_broker, models.double, batch_size=4)
    streamer = make_streamer(fault_broker, timeout=20)
    assert streamer.predict([1]) == [2]
    caplog.set_level(logging.WARNING, logger="streamer_core.redis")

    def said(words: str) -> list:
        start = f"streamer:{fault_broker.prefix}: {words}"
        return [r.getMessage() for r in caplog.records if r.getMessage().startswith(start)]

    for outage in (1, 2):
        fault_broker.server.kill()
        for x in range(3):
            with pytest.raises(BrokerUnavailableError):
                streamer.predict([x])
        assert len(said("could not send to Redis")) == outage, said("could not send to Redis")
        assert said("sending to Redis again")[outage - 1 :] == [], "not back yet"
        fault_broker.server.start()
        errors: list = []
        assert wait_for(functools.partial(_answers, streamer, errors), 20), errors
        again = said("sending to Redis again")
        assert len(again) == outage, again
        tries = int(again[-1].rsplit("; ", 1)[1].split()[0])
        assert tries >= 3, again[-1]  # each of the three calls' tries at least
        assert len(said("could not send to Redis")) == outage
