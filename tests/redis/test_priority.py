"""Priority levels on the Redis backend: a stream per level, read highest
first by every worker; a busy worker takes the next interactive request
before the bulk it read ahead; delivery, taking over a dead worker's
requests, dead-lettering and sending again after a restart hold at every
level; per-level bounds and timeouts on the web side; a web process of
more levels than its workers read refuses the calls no worker would read."""

from __future__ import annotations

import json
import logging
import os
import signal
import threading
import time
from typing import Any, List

import pytest
import redis

from streamer_core import NoWorkerError, QueueFullError, StreamerTimeoutError
from streamer_core.telemetry.stats import stats_for
from tests.redis import models
from tests.redis.conftest import GROUP, outcomes_of, wait_for

TWO = {"priority_levels": 2}


def _low(broker: Any) -> str:
    return f"{broker.requests}:2"


def _pending(broker: Any, stream: str) -> int:
    try:
        return int(broker.conn.xpending(stream, GROUP)["pending"])
    except redis.ResponseError:
        return 0


class Recorder:
    """A model that records each batch, in the order batches run, over
    every worker, and which worker (its thread) ran it."""

    def __init__(self, seconds: float = 0.0) -> None:
        self.batches: List[List[Any]] = []
        self.workers: List[int] = []
        self.seconds = seconds
        self._lock = threading.Lock()

    def __call__(self, batch: List[Any]) -> List[Any]:
        with self._lock:
            self.batches.append(list(batch))
            self.workers.append(threading.get_ident())
        time.sleep(self.seconds)
        return [f"ok:{x}" for x in batch]

    def of_each_worker(self) -> List[List[List[Any]]]:
        workers = dict.fromkeys(self.workers)
        return [[b for b, w in zip(self.batches, self.workers) if w == worker] for worker in workers]


def test_every_worker_reads_a_levels_requests_before_a_lower_levels(broker, make_streamer, start_worker):
    streamer = make_streamer(broker, **TWO)
    bulk = [streamer.submit([f"bulk{i}"], priority=2) for i in range(16)]
    interactive = [streamer.submit([f"query{i}"], priority=1) for i in range(12)]
    assert wait_for(lambda: broker.xlen(_low(broker)) == 16 and broker.xlen() == 12, 5), "each level has its stream"
    model = Recorder(0.05)
    for _ in range(2):
        start_worker(broker, model, batch_size=4, max_latency=0.01, **TWO)
    assert [f.result(10) for f in interactive + bulk] == [[f"ok:query{i}"] for i in range(12)] + [
        [f"ok:bulk{i}"] for i in range(16)
    ]
    assert len(model.of_each_worker()) == 2, "both workers served"
    for batches in model.of_each_worker():
        kinds = ["query" if all(x.startswith("query") for x in b) else "bulk" for b in batches]
        assert kinds == sorted(kinds, reverse=True), f"a worker ran level 1's requests first: {batches}"
    assert wait_for(lambda: broker.xlen() + broker.xlen(_low(broker)) == 0, 3), "acknowledged and deleted, per stream"
    assert _pending(broker, broker.requests) == _pending(broker, _low(broker)) == 0


def test_a_busy_worker_takes_the_next_interactive_request_before_the_bulk_it_read_ahead(
    broker, make_streamer, start_worker, gate
):
    worker = start_worker(broker, gate, batch_size=4, max_latency=0.01, name=f"worker-{broker.prefix}", **TWO)
    streamer = make_streamer(broker, **TWO)
    # Once the web process knows the worker's batch size, it sends no more
    # than two batches' worth at a time (BATCHES_PER_WORKER): the bulk
    # below fills that, and the interactive request goes all the same.
    assert wait_for(lambda: streamer._backend.roster.batch_sizes == [4], 10), "the worker's batch size is seen"
    held = streamer.submit(["hold"], priority=2)
    assert gate.entered.wait(10)
    bulk = [streamer.submit([f"bulk{i}"], priority=2) for i in range(8)]
    assert wait_for(lambda: worker.worker.gauges()[0] == 4, 5), "a full bulk batch is read ahead"
    query = streamer.submit(["query"], priority=1)
    assert wait_for(lambda: worker.worker.gauges()[0] == 5, 5), "the interactive request is read beside it"
    assert [level.queue_depth for level in worker.worker.stats().priorities] == [1, 4], "read ahead, by level"
    gate.release()
    assert query.result(10) == ["ok:query"] and held.result(10) == ["ok:hold"]
    assert [f.result(10) for f in bulk] == [[f"ok:bulk{i}"] for i in range(8)]
    assert gate.batches[1] == ["query", "bulk0", "bulk1", "bulk2"], "the next batch: the interactive request first"
    waits = [level.queue_wait_seconds.count for level in worker.worker.stats().priorities]
    assert waits == [1, 9], "the worker counts each input's wait at its level"


def test_a_worker_reads_ahead_one_batch_over_all_its_levels_together(broker, make_streamer, start_worker, gate):
    """The bound on what a busy worker holds (one batch beyond the one
    running) is over the levels together: filled from level 1, the lower
    level's requests stay in their stream for another worker."""
    streamer = make_streamer(broker, **TWO)
    high = [streamer.submit(["hold"], priority=1)] + [streamer.submit([f"query{i}"], priority=1) for i in range(7)]
    low = [streamer.submit([f"bulk{i}"], priority=2) for i in range(4)]
    assert wait_for(lambda: broker.xlen() == 8 and broker.xlen(_low(broker)) == 4, 5)
    worker = start_worker(broker, gate, batch_size=4, max_latency=0.01, **TWO)
    assert gate.entered.wait(10)
    assert wait_for(lambda: worker.worker.gauges()[0] == 4, 5), "the next batch of level 1 is read ahead"
    time.sleep(0.5)  # a few reads more, were any to come
    assert _pending(broker, _low(broker)) == 0, "it read level 2's requests beyond the one batch it may hold"
    assert worker.worker.gauges()[0] == 4
    gate.release()
    assert [f.result(10) for f in high + low] == [["ok:hold"]] + [[f"ok:query{i}"] for i in range(7)] + [
        [f"ok:bulk{i}"] for i in range(4)
    ]


def test_a_dead_workers_requests_of_every_level_are_taken_over_the_highest_first(
    fault_broker, make_streamer, start_worker, procs, tmp_path
):
    (tmp_path / "hold").write_text("")
    streamer = make_streamer(fault_broker, timeout=20, **TWO)
    futures = [streamer.submit([x], priority=2) for x in range(6)]
    futures += [streamer.submit([x], priority=1) for x in (10, 11)]
    assert wait_for(lambda: fault_broker.xlen() + fault_broker.xlen(_low(fault_broker)) == 8, 5)
    dying = procs.worker(
        fault_broker, "HoldModel", batch_size=4, max_latency=0.05, claim_after=0.5,
        model_init_kwargs={"folder": str(tmp_path)}, **TWO,
    )  # fmt: skip
    assert wait_for(lambda: list(tmp_path.glob("inside-*")), 15), procs.log(dying)
    assert json.loads(next(tmp_path.glob("inside-*")).read_text()) == [10, 11, 0, 1], "level 1 read first"
    assert wait_for(lambda: _pending(fault_broker, _low(fault_broker)) == 6, 5), "and the next batch read ahead"
    os.kill(dying.pid, signal.SIGKILL)
    (tmp_path / "hold").unlink()
    model = Recorder()
    start_worker(fault_broker, model, batch_size=4, claim_after=0.5, **TWO)
    assert [f.result(15) for f in futures] == [[f"ok:{x}"] for x in (*range(6), 10, 11)]
    assert model.batches[:2] == [[10], [11]], "taken over one at a time, level 1's first"
    assert stats_for(fault_broker.prefix).snapshot().redelivered >= 8
    assert wait_for(lambda: fault_broker.xlen() + fault_broker.xlen(_low(fault_broker)) == 0, 3)


def test_a_busy_worker_keeps_its_lower_level_requests_from_being_taken_over(broker, make_streamer, start_worker):
    """Its heartbeat claims each request again on the stream it came from."""
    model = Recorder(1.5)  # three times claim_after
    for _ in range(2):
        start_worker(broker, model, batch_size=4, claim_after=0.5, **TWO)
    streamer = make_streamer(broker, **TWO)
    redelivered = stats_for(broker.prefix).snapshot().redelivered
    assert streamer.predict(["slow"], priority=2) == ["ok:slow"]
    assert model.batches == [["slow"]] and stats_for(broker.prefix).snapshot().redelivered == redelivered


def test_a_malformed_lower_level_request_is_dead_lettered_from_its_stream(broker, make_streamer, start_worker):
    seen: List[Any] = []
    worker = start_worker(broker, lambda batch: seen.extend(batch) or models.double(batch), **TWO)
    entry_id = broker.conn.xadd(_low(broker), {"c": "web", "i": "ab", "t": "soon"}).decode()
    assert make_streamer(broker, **TWO).predict([21], priority=2) == [42]
    key = f"streamer:{broker.prefix}:dead"
    assert wait_for(lambda: broker.conn.xlen(key) == 1, 3)
    [(_, copy)] = broker.conn.xrange(key)
    assert copy[b"key"] == _low(broker).encode() and copy[b"id"] == entry_id.encode()
    assert wait_for(lambda: broker.xlen(_low(broker)) == 0 and _pending(broker, _low(broker)) == 0, 3)
    assert seen == [21] and worker.alive()


def test_calls_of_every_level_are_sent_again_after_redis_restarts_empty(fault_broker, make_streamer, start_worker):
    streamer = make_streamer(fault_broker, timeout=12, **TWO)
    futures = [streamer.submit([x], priority=1 + x % 2) for x in range(6)]
    assert wait_for(lambda: fault_broker.xlen() == 3 and fault_broker.xlen(_low(fault_broker)) == 3, 5)
    fault_broker.server.restart(down_for=0.5)
    start_worker(fault_broker, models.double, batch_size=4, **TWO)
    assert outcomes_of(futures, 15) == [[x * 2] for x in range(6)], "each level's requests sent again, to its stream"


def test_a_lower_level_call_given_up_is_deleted_from_its_stream(broker, make_streamer):
    streamer = make_streamer(broker, **TWO)
    future = streamer.submit(["late"], priority=2)
    assert wait_for(lambda: broker.xlen(_low(broker)) == 1, 5)
    assert future.cancel()
    assert wait_for(lambda: broker.xlen(_low(broker)) == 0, 3), "no worker runs it for nobody"


def test_each_level_has_its_own_bound_and_default_timeout_on_the_web_side(broker, make_streamer):
    streamer = make_streamer(broker, max_queue=3, priority_max_queue=[None, 2], priority_timeout=[None, 0.3], **TWO)
    waiting = [streamer.submit([i], priority=1) for i in range(5)]  # None: no bound at level 1, though max_queue is 3
    started = time.monotonic()
    with pytest.raises(StreamerTimeoutError):
        streamer.predict(["low"], priority=2)
    assert 0.2 < time.monotonic() - started < 3, "level 2's own default timeout"
    assert not any(f.done() for f in waiting), "level 1 keeps the streamer's timeout"
    waiting += [streamer.submit([i], priority=2) for i in range(2)]
    with pytest.raises(QueueFullError, match="priority 2 of this process wait for an answer and its bound is 2"):
        streamer.submit(["more"], priority=2)
    assert streamer.stats().requests["rejected"] >= 1
    assert wait_for(lambda: streamer._backend.ledger.by_level() == [5, 2], 5), "all sent to Redis"
    assert [level.queue_depth for level in streamer.stats().priorities] == [5, 2], "waiting, by level"


def test_a_web_tier_of_more_levels_than_its_workers_read_refuses_the_calls_they_would_not_read(
    broker, make_streamer, start_worker, caplog
):
    start_worker(broker, models.double, batch_size=4)  # one level: as a worker of a version before levels reads
    with caplog.at_level(logging.WARNING, logger="streamer_core.redis"):
        streamer = make_streamer(broker, require_workers=True, **TWO)
        assert streamer.wait_ready(10)
        assert wait_for(lambda: streamer._backend.roster.levels_read == 1, 5)
        refusal = "no live worker reads priority 2 of .* start them with priority_levels=2"
        with pytest.raises(NoWorkerError, match=refusal):
            streamer.predict([1], priority=2)
        assert streamer.predict([1], priority=1) == [2], "level 1's stream is the one stream it reads"
    assert any("read 1 priority level(s), and this web process sends 2" in r.getMessage() for r in caplog.records)
    assert broker.xlen(_low(broker)) == 0, "nothing was left where nobody reads"


def test_a_lower_level_request_withdrawn_while_read_ahead_never_runs(broker, make_streamer, start_worker, gate):
    worker = start_worker(broker, gate, batch_size=4, max_latency=0.01, **TWO)
    streamer = make_streamer(broker, **TWO)
    held = streamer.submit(["hold"], priority=2)
    assert gate.entered.wait(10)
    bulk = [streamer.submit([f"bulk{i}"], priority=2) for i in range(4)]
    assert wait_for(lambda: worker.worker.gauges()[0] == 4, 5), "read ahead by the busy worker"
    assert bulk[0].cancel()
    assert wait_for(lambda: broker.xlen(_low(broker)) == 4, 3), "its entry deleted from its stream"
    gate.release()
    assert [f.result(10) for f in bulk[1:]] == [[f"ok:bulk{i}"] for i in range(1, 4)] and held.result(10)
    assert "bulk0" not in gate.seen(), "withdrawn, it never reached the model"


def test_the_status_command_shows_each_levels_requests(broker, make_streamer):
    from flask import Flask

    from flask_streamer import FlaskStreamer

    app = Flask(f"levels-{broker.prefix}")
    app.config.update(STREAMER_BACKEND="redis", STREAMER_REDIS_URL=broker.url, STREAMER_PRIORITY_LEVELS=2)
    FlaskStreamer(app).add_batched_route("/double", "double", models.double, prefix=broker.prefix)
    streamer = make_streamer(broker, timeout=30, **TWO)
    waiting = [streamer.submit([x], priority=1) for x in range(2)]
    waiting += [streamer.submit([x], priority=2) for x in range(3)]
    assert wait_for(lambda: broker.xlen() == 2 and broker.xlen(_low(broker)) == 3, 5)
    runner = app.test_cli_runner()
    report = json.loads(runner.invoke(args=["streamer", "status", "--json"]).output)["models"]["double"]
    assert report["waiting"] == 5 and report["pending"] == 0 and report["oldest_waiting_s"] >= 0
    assert report["levels"] == [{"waiting": 2, "pending": 0}, {"waiting": 3, "pending": 0}]
    assert report["settings"]["priority_levels"] == 2
    text = runner.invoke(args=["streamer", "status"]).output
    assert "  by priority: 1: 2 waiting, 0 pending; 2: 3 waiting, 0 pending" in text.splitlines(), text
    assert not any(future.done() for future in waiting)


def test_a_worker_that_does_not_say_its_levels_is_taken_to_read_one(broker, make_streamer):
    """A worker of a version before levels writes no ``levels`` in its
    info: it reads the first stream only, and with ``require_workers`` a
    call at level 2 is refused at once, not left where nobody reads."""
    from streamer_core.backends.redis.wire import BEAT_SCRIPT, PRESENCE_TTL_MS, Keys

    keys = Keys(broker.prefix)
    stop = threading.Event()

    def old_worker() -> None:  # its heartbeat and its info, as such a worker writes them
        while not stop.is_set():
            broker.conn.eval(BEAT_SCRIPT, 1, keys.workers, "old-worker", PRESENCE_TTL_MS)
            broker.conn.hset(keys.worker_info, "old-worker", json.dumps({"host": "h", "pid": 1, "device": None}))
            stop.wait(0.2)

    beating = threading.Thread(target=old_worker, daemon=True)
    beating.start()
    try:
        streamer = make_streamer(broker, require_workers=True, **TWO)
        assert wait_for(lambda: streamer._backend.roster.levels_read == 1, 5)
        with pytest.raises(NoWorkerError, match="no live worker reads priority 2"):
            streamer.predict([1], priority=2)
    finally:
        stop.set()
        beating.join(5)
