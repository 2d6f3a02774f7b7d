"""Large calls on the Redis backend: a call of more inputs than the workers'
batches does not reach the requests stream all at once. A web process lets
in two batches' worth of it for each live worker (each worker's batch size,
from the info it writes), the rest waiting in the web process until answers
come, so that a call made after it reaches the stream ahead of its rest
and is answered before its last batches run. Real Redis, real workers."""

from __future__ import annotations

import json
import threading
import time
from typing import Any, List

import pytest

from streamer_core import StreamerTimeoutError
from streamer_core.backends.redis import collector
from streamer_core.backends.redis.client import BATCHES_PER_WORKER
from streamer_core.backends.redis.roster import Roster
from streamer_core.backends.redis.wire import Keys
from streamer_core.batching import former
from streamer_core.batching.scheduler import Scheduler
from tests.redis.conftest import wait_for


class Gated:
    """A model for a thread worker that runs each batch only once let
    (``open``), records the batches, and answers each input with itself."""

    def __init__(self, seconds_a_batch: float = 0.0) -> None:
        self.batches: List[List[Any]] = []
        self.go = threading.Event()
        self.seconds_a_batch = seconds_a_batch

    def __call__(self, batch: List[Any]) -> List[Any]:
        assert self.go.wait(20), "never let to run"
        self.batches.append(list(batch))
        time.sleep(self.seconds_a_batch)
        return list(batch)

    def seen(self) -> List[Any]:
        return [x for batch in self.batches for x in batch]


def in_stream(broker: Any) -> int:
    return int(broker.conn.xlen(broker.requests)) if broker.conn.exists(broker.requests) else 0


def test_only_two_of_each_workers_batches_of_a_large_call_are_in_the_stream_at_once(
    broker, make_streamer, start_worker
):
    model = Gated()
    start_worker(broker, model, batch_size=8)
    streamer = make_streamer(broker)
    assert streamer.wait_ready(10)
    future = streamer.submit([f"a{n}" for n in range(200)])
    limit = BATCHES_PER_WORKER * 8
    assert wait_for(lambda: in_stream(broker) >= limit, 5), in_stream(broker)
    time.sleep(0.3)  # the dispatcher looks again every GATED_RECHECK_S: more would have gone by now
    assert in_stream(broker) == limit, "the rest of the call waits in the web process"
    model.go.set()
    assert future.result(20) == [f"a{n}" for n in range(200)]
    assert model.seen() == [f"a{n}" for n in range(200)], "its inputs ran in order, each once"


@pytest.mark.parametrize("require_workers", [False, True], ids=["plain", "requiring-workers"])
def test_workers_that_start_after_the_web_process_are_counted_within_a_second(
    broker, make_streamer, start_worker, require_workers
):
    """The web process counts the workers' batches as it checks on Redis,
    once a second (a streamer requiring workers checks on them then too)."""
    streamer = make_streamer(broker, require_workers=require_workers)
    model = Gated()
    start_worker(broker, model, batch_size=8)
    assert wait_for(lambda: broker.conn.zcard(f"streamer:{broker.prefix}:workers") == 1, 10)
    time.sleep(1.5)  # a check since the worker was seen
    future = streamer.submit(list(range(200)))
    limit = BATCHES_PER_WORKER * 8
    assert wait_for(lambda: in_stream(broker) >= limit, 5), in_stream(broker)
    time.sleep(0.3)
    assert in_stream(broker) == limit, "two of the worker's batches of 8, not of the default 64"
    model.go.set()
    assert future.result(20) == list(range(200))


def test_a_call_after_a_large_one_is_answered_before_the_large_ones_last_batches(broker, make_streamer, start_worker):
    model = Gated(seconds_a_batch=0.01)
    start_worker(broker, model, batch_size=8)
    streamer = make_streamer(broker)
    assert streamer.wait_ready(10)
    large = streamer.submit([f"a{n}" for n in range(400)])
    assert wait_for(lambda: in_stream(broker) > 0, 5)
    small = streamer.submit(["query"])
    model.go.set()
    assert small.result(20) == ["query"]
    assert not large.done(), "answered while the large call still runs"
    assert large.result(20) == [f"a{n}" for n in range(400)]
    where = next(n for n, batch in enumerate(model.batches) if "query" in batch)
    # Behind at most the two batches' worth of the large call in the stream
    # when it came, and what answers let in meanwhile: 50 batches in all.
    assert where <= 6, [len(batch) for batch in model.batches[: where + 1]]


def test_a_large_call_alone_is_spread_over_every_worker(broker, make_streamer, start_worker):
    """Two workers: twice as much of the call is out (two batches of each's),
    and both run it."""
    first, second = Gated(seconds_a_batch=0.02), Gated(seconds_a_batch=0.02)
    start_worker(broker, first, batch_size=8)
    start_worker(broker, second, batch_size=8)
    assert wait_for(lambda: broker.conn.zcard(f"streamer:{broker.prefix}:workers") == 2, 10)
    streamer = make_streamer(broker)  # counts the workers as it starts
    future = streamer.submit(list(range(320)))
    limit = BATCHES_PER_WORKER * (8 + 8)
    assert wait_for(lambda: in_stream(broker) >= limit, 5), in_stream(broker)
    time.sleep(0.3)
    assert in_stream(broker) == limit
    first.go.set()
    second.go.set()
    assert future.result(20) == list(range(320))
    assert sorted(first.seen() + second.seen()) == list(range(320)), "each input ran once"
    assert len(first.batches) >= 5 and len(second.batches) >= 5, (len(first.batches), len(second.batches))


def served_at_once(broker: Any, make_streamer: Any, start_worker: Any) -> Any:
    """A streamer whose one worker (batches of 8) runs each batch as it comes."""
    model = Gated()
    model.go.set()
    start_worker(broker, model, batch_size=8)
    streamer = make_streamer(broker, timeout=15)
    assert streamer.wait_ready(10)
    return streamer


def test_answers_let_the_rest_of_a_large_call_in_at_once(broker, make_streamer, start_worker, monkeypatch):
    """The web process looks at its held inputs as answers come, not at its
    next recheck (stretched here to 30 s: a call waiting for it would time out)."""
    monkeypatch.setattr(former, "GATED_RECHECK_S", 30.0)
    streamer = served_at_once(broker, make_streamer, start_worker)
    assert streamer.predict(list(range(400))) == list(range(400))


def test_the_web_process_looks_again_once_the_answers_are_handed_over(broker, make_streamer, start_worker, monkeypatch):
    """Woken before the answers reached their calls, the dispatcher would
    find the gate still shut and sleep until its recheck. Each wake-up here
    notes how many batches of answers had been handed over by then."""
    handed_over: List[int] = []
    seen_at_wake: List[int] = []
    deliver, wake = collector.deliver, Scheduler.wake_parked

    def counted(items: Any, outcomes: Any) -> None:
        deliver(items, outcomes)
        handed_over.append(len(items))

    def noted(self: Scheduler) -> None:
        seen_at_wake.append(len(handed_over))
        wake(self)

    monkeypatch.setattr(collector, "deliver", counted)
    monkeypatch.setattr(Scheduler, "wake_parked", noted)
    streamer = served_at_once(broker, make_streamer, start_worker)
    assert streamer.predict(list(range(80))) == list(range(80))
    assert seen_at_wake and seen_at_wake[0] >= 1, seen_at_wake
    assert seen_at_wake == sorted(seen_at_wake) and all(n >= 1 for n in seen_at_wake)


def test_a_wake_up_missed_costs_a_recheck_not_the_call(broker, make_streamer, start_worker, monkeypatch):
    """Were the web process never told of answers, it would still let the
    rest of a large call in, every GATED_RECHECK_S."""
    monkeypatch.setattr(Scheduler, "wake_parked", lambda self: None)
    streamer = served_at_once(broker, make_streamer, start_worker)
    assert streamer.predict(list(range(80))) == list(range(80))


def test_the_parked_inputs_of_a_large_call_that_timed_out_never_reach_redis(broker, make_streamer, start_worker):
    model = Gated()
    start_worker(broker, model, batch_size=8)
    streamer = make_streamer(broker)
    assert streamer.wait_ready(10)
    future = streamer.submit(list(range(100)), timeout=0.5)
    try:
        future.result(5)
        raise AssertionError("the call should have timed out")
    except StreamerTimeoutError:
        pass
    model.go.set()
    assert streamer.predict(["after"]) == ["after"]
    assert len(model.seen()) <= 1 + BATCHES_PER_WORKER * 8, "at most what was in Redis as it ended"


def test_a_worker_info_that_does_not_say_a_whole_batch_size_counts_as_the_default(broker):
    """Anyone with access to Redis may write the workers' info: a batch size
    that is not a whole number of at least 1 (a boolean, 0, text, none at
    all, no JSON object) counts as the default, 64."""
    conn = broker.conn
    seconds, micros = conn.time()
    now_ms = seconds * 1000 + micros // 1000
    infos = {
        "w1": json.dumps({"batch_size": 16}),
        "w2": json.dumps({"batch_size": True}),
        "w3": json.dumps({"batch_size": 0}),
        "w4": json.dumps({"batch_size": "32"}),
        "w5": json.dumps({}),
        "w6": "not json",
        "w7": json.dumps([8]),
    }
    keys = Keys(broker.prefix)
    conn.zadd(keys.workers, {name: now_ms for name in infos})
    conn.hset(keys.worker_info, mapping=infos)
    roster = Roster(keys, require_workers=False)
    assert sorted(roster.live_batch_sizes(conn)) == [16] + [64] * 6
    assert roster.batch_sizes == roster.live_batch_sizes(conn)
