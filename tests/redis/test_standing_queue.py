"""Overload over Redis (``streamer_core.batching.overload``): a web process sends no
more than its live workers take in two batches each, out unanswered, so
that what waits beyond that waits in the web process, where a standing
queue that callers leave is served newest first and its longest waiting
refused; workers read the stream oldest first, and what is sent keeps its
delivery (at least once, taken over from a dead worker) as before."""

from __future__ import annotations

import time

from streamer_core import OverloadedError
from streamer_core.backends.redis.client import BATCHES_PER_WORKER
from tests.helpers import beating_workers
from tests.redis.conftest import wait_for


def _workers_seen(streamer, broker) -> None:
    """The worker beats, and the web process has read its batch size (it
    looks once a second)."""
    assert wait_for(lambda: beating_workers(broker.url, broker.prefix) == 1, 10)
    assert wait_for(lambda: streamer._backend.roster.batch_sizes == [2], 10)


def _holding_after_quick_answers(streamer, broker, gate):
    """Once the worker is seen and a few quick answers tell the web process
    a round trip is short: a call the worker holds at the gate."""
    _workers_seen(streamer, broker)
    for i in range(5):
        assert streamer.predict([f"w{i}"]) == [f"ok:w{i}"]
    held = streamer.submit(["hold"])
    assert gate.entered.wait(5)
    return held


def test_no_more_is_sent_than_the_workers_take_in_two_batches(broker, make_streamer, start_worker, gate):
    start_worker(broker, gate, batch_size=2)
    streamer = make_streamer(broker, timeout=20, overload_after=0.05, overload_wait=30)
    _workers_seen(streamer, broker)
    held = streamer.submit(["hold"])
    assert gate.entered.wait(5)
    calls = [streamer.submit([f"p{i}"]) for i in range(10)]
    time.sleep(0.5)
    assert broker.xlen() <= BATCHES_PER_WORKER * 2, "more was sent than the worker takes in two batches"
    assert streamer.queued() >= 10 + 1 - BATCHES_PER_WORKER * 2, "what was not sent waits in the web process"
    gate.release()
    # Patient callers, none leaving: every one answered, first come first served.
    assert held.result(10) == ["ok:hold"]
    assert [call.result(10) for call in calls] == [[f"ok:p{i}"] for i in range(10)]
    assert gate.seen() == ["hold"] + [f"p{i}" for i in range(10)]


def test_a_standing_queue_callers_leave_is_sent_newest_first_and_its_longest_waiting_refused(
    broker, make_streamer, start_worker, gate
):
    start_worker(broker, gate, batch_size=2)
    streamer = make_streamer(broker, timeout=20, overload_after=0.05, overload_wait=0.3)
    held = _holding_after_quick_answers(streamer, broker, gate)
    sent = [streamer.submit([f"s{i}"]) for i in range(3)]  # the room the worker's two batches leave
    assert wait_for(lambda: broker.xlen() == 4, 5)
    old = [streamer.submit([f"old{i}"]) for i in range(4)]
    assert wait_for(lambda: streamer.queued() == 4, 5)
    old[0].cancel()
    old[1].cancel()  # callers leave
    time.sleep(0.5)  # old2 and old3 wait past overload_wait
    new = [streamer.submit([f"new{i}"]) for i in range(2)]
    gate.release()
    assert held.result(10) == ["ok:hold"] and [call.result(10) for call in sent] == [[f"ok:s{i}"] for i in range(3)]
    assert [call.result(10) for call in new] == [["ok:new0"], ["ok:new1"]]
    for call in old[2:]:
        assert isinstance(call.exception(10), OverloadedError), call.exception(0)
    seen = gate.seen()
    assert not any(x.startswith("old") for x in seen), f"a refused input reached the worker: {seen}"
    assert seen.index("new1") < seen.index("new0"), f"the standing queue was not sent newest first: {seen}"


def test_callers_who_leave_while_their_inputs_are_out_make_the_queue_overloaded(
    broker, make_streamer, start_worker, gate
):
    """Served first come first served, a web process sends inputs still
    alive, and their callers leave while they are out at the workers,
    never seen leaving its queue: their deadlines passing count."""
    start_worker(broker, gate, batch_size=2)
    streamer = make_streamer(broker, timeout=20, overload_after=0.05, overload_wait=30)
    held = _holding_after_quick_answers(streamer, broker, gate)
    leaving = [streamer.submit([f"s{i}"], timeout=0.3) for i in range(3)]  # sent: the room the worker leaves
    assert wait_for(lambda: broker.xlen() == 4, 5)
    patient = [streamer.submit([f"p{i}"]) for i in range(4)]
    assert wait_for(lambda: streamer.queued() == 4, 5)
    for call in leaving:
        assert call.exception(5) is not None  # their deadlines pass while their inputs are out
    gate.release()
    assert held.result(10) == ["ok:hold"]
    assert [call.result(10) for call in patient] == [[f"ok:p{i}"] for i in range(4)]
    seen = gate.seen()
    assert seen.index("p3") < seen.index("p0"), f"the standing queue was not sent newest first: {seen}"


def test_switched_off_everything_is_sent_as_it_comes(broker, make_streamer, start_worker, gate):
    start_worker(broker, gate, batch_size=2)
    streamer = make_streamer(broker, timeout=20, overload_after=None)
    _workers_seen(streamer, broker)
    held = streamer.submit(["hold"])
    assert gate.entered.wait(5)
    calls = [streamer.submit([f"p{i}"]) for i in range(10)]
    broker.wait_queued(11)
    gate.release()
    assert held.result(10) == ["ok:hold"] and [call.result(10) for call in calls] == [[f"ok:p{i}"] for i in range(10)]
