"""Overload without deadlines (``streamer_core.batching.overload``): once every batch
for ``overload_after`` seconds has left inputs behind while callers leave
the queue unanswered, the newest inputs go first and those that waited
longer than ``overload_wait`` are refused (``OverloadedError``, counted
``expired``); when a batch leaves nothing behind, first come first served
again. A queue that stands with patient callers stays first come first
served. Priority levels keep their order."""

from __future__ import annotations

import threading
import time
from typing import Any, Iterator, List

import pytest

from streamer_core import OverloadedError, Streamer, ThreadedStreamer
from streamer_core.backends.redis.reader import Handover
from streamer_core.batching.former import BatchFormer
from streamer_core.batching.levels import LeveledQueue
from streamer_core.batching.overload import LEAVING_MOST, LEAVING_WINDOW_S, StandingQueue
from streamer_core.options.config import BatchingConfig
from tests.core import models
from tests.helpers import wait_for


class Steps:
    """A model that records each batch and runs it only when the test lets
    it (:meth:`step`): the test decides when each batch ends, so when the
    next one is taken."""

    def __init__(self) -> None:
        self.batches: List[List[Any]] = []
        self._steps = threading.Semaphore(0)
        self._lock = threading.Lock()

    def __call__(self, batch: List[Any]) -> List[Any]:
        with self._lock:
            self.batches.append(list(batch))
        assert self._steps.acquire(timeout=20), "the test never let the batch end"
        return [f"ok:{x}" for x in batch]

    def step(self, then: float = 0.0) -> None:
        """End the batch running now; wait ``then`` seconds after."""
        self._steps.release()
        time.sleep(then)

    def started(self, count: int) -> bool:
        return wait_for(lambda: len(self.batches) >= count, 5)


@pytest.fixture
def steps() -> Iterator[Steps]:
    model = Steps()
    yield model
    for _ in range(64):  # whatever the test left running ends
        model.step()


def _calls(streamer: Any, names: List[str], **options: Any) -> List[Any]:
    return [streamer.submit([name], **options) for name in names]


def test_a_standing_queue_callers_leave_is_served_newest_first_then_in_order_again(closing, steps):
    streamer = closing(ThreadedStreamer(steps, batch_size=2, max_latency=0.01, overload_after=0.05, overload_wait=30))
    first = _calls(streamer, ["hold"])
    assert steps.started(1)
    ahead = _calls(streamer, ["a0", "a1"])  # a full batch: handed ahead to the busy model
    rest = _calls(streamer, [f"a{i}" for i in range(2, 10)])
    assert wait_for(lambda: streamer.queued() == 8, 5)
    for call in rest[:2]:
        call.cancel()  # two callers leave: met at the head, dropped unrun
    steps.step(0.1)  # "hold" ends; [a0, a1] runs; [a4, a5] is handed ahead, leaving a6..a9 behind
    assert steps.started(2)
    steps.step(0.1)  # past overload_after: the queue stands, callers have left
    assert steps.started(3)
    steps.step()
    assert steps.started(4)
    steps.step()
    steps.step()
    assert [call.result(5) for call in rest[2:]] == [[f"ok:a{i}"] for i in range(4, 10)]
    assert steps.batches == [["hold"], ["a0", "a1"], ["a4", "a5"], ["a9", "a8"], ["a7", "a6"]]
    assert first[0].result(5) == ["ok:hold"] and ahead[1].result(5) == ["ok:a1"]
    # Drained: first come, first served again.
    later = _calls(streamer, ["hold"])
    assert steps.started(6)
    more = _calls(streamer, ["c0", "c1", "c2", "c3", "c4"])
    assert wait_for(lambda: streamer.queued() == 3, 5)
    for _ in range(4):
        steps.step()
    assert [call.result(5) for call in later + more] == [["ok:hold"]] + [[f"ok:c{i}"] for i in range(5)]
    assert steps.batches[5:] == [["hold"], ["c0", "c1"], ["c2", "c3"], ["c4"]]


def test_callers_whose_deadlines_pass_count_as_leaving_though_never_met_in_line(closing, steps):
    """Callers whose timeouts pass together (a retry storm's) are dropped
    from the queue at once, more than half of it, without a batch meeting
    them: they count as callers leaving all the same."""
    streamer = closing(ThreadedStreamer(steps, batch_size=2, max_latency=0.01, overload_after=0.05, overload_wait=30))
    _calls(streamer, ["hold"])
    assert steps.started(1)
    _calls(streamer, ["a0", "a1"])  # handed ahead to the busy model
    leaving = _calls(streamer, [f"t{i}" for i in range(7)], timeout=0.2)  # more than half
    patient = _calls(streamer, [f"p{i}" for i in range(6)])
    for call in leaving:
        assert call.exception(5) is not None
    assert wait_for(lambda: streamer.queued() == 6, 5), "the expired are taken out of the queue"
    for _ in range(5):
        steps.step(0.1)
    assert [call.result(5) for call in patient] == [[f"ok:p{i}"] for i in range(6)]
    assert steps.batches == [["hold"], ["a0", "a1"], ["p5", "p4"], ["p3", "p2"], ["p1", "p0"]]


def test_a_standing_queue_of_patient_callers_is_served_in_order(closing, steps):
    """A closed loop of more callers than a batch holds keeps the queue
    standing without anyone leaving: newest first would serve the same few
    callers over and over."""
    streamer = closing(ThreadedStreamer(steps, batch_size=2, max_latency=0.01, overload_after=0.05, overload_wait=0.1))
    _calls(streamer, ["hold"])
    assert steps.started(1)
    calls = _calls(streamer, [f"p{i}" for i in range(8)])
    assert wait_for(lambda: streamer.queued() == 6, 5)
    for _ in range(5):
        steps.step(0.1)
    assert [call.result(5) for call in calls] == [[f"ok:p{i}"] for i in range(8)], "a patient caller was refused"
    assert steps.batches == [["hold"], ["p0", "p1"], ["p2", "p3"], ["p4", "p5"], ["p6", "p7"]]


def test_under_overload_an_input_that_waited_too_long_is_refused_unrun(closing, steps):
    streamer = closing(
        ThreadedStreamer(steps, batch_size=2, max_latency=0.01, overload_after=0.05, overload_wait=0.2, name="shed")
    )
    for i in range(5):  # quick batches: the model's batch time is known to be short
        warm = streamer.submit([f"w{i}"])
        steps.step()
        assert warm.result(5) == [f"ok:w{i}"]
    _calls(streamer, ["hold"])
    assert steps.started(6)
    _calls(streamer, ["a0", "a1"])  # handed ahead, leaving the queue standing behind it
    old = _calls(streamer, [f"old{i}" for i in range(6)])
    assert wait_for(lambda: streamer.queued() == 6, 5)
    old[0].cancel()
    old[1].cancel()  # callers leave
    time.sleep(0.4)  # longer than overload_wait, and than twice a batch of the model
    steps.step(0.05)  # overloaded: the four left waited too long, refused unrun
    new = _calls(streamer, ["new0", "new1"])
    steps.step()
    steps.step()
    for call in old[2:]:
        error = call.exception(5)
        assert isinstance(error, OverloadedError) and error.retry_after_s == 1.0, error
        assert "overloaded" in str(error) and "overload_wait" in str(error)
    assert [call.result(5) for call in new] == [["ok:new0"], ["ok:new1"]]
    assert steps.batches[5:] == [["hold"], ["a0", "a1"], ["new0", "new1"]], steps.batches
    stats = streamer.stats()
    assert stats.dropped["expired"] == 4 and stats.requests["rejected"] == 4, (stats.dropped, stats.requests)


def test_switched_off_a_standing_queue_is_served_in_order(closing, steps):
    streamer = closing(ThreadedStreamer(steps, batch_size=2, max_latency=0.01, overload_after=None, overload_wait=0.1))
    _calls(streamer, ["hold"])
    assert steps.started(1)
    _calls(streamer, ["a0", "a1"])
    rest = _calls(streamer, [f"a{i}" for i in range(2, 10)])
    assert wait_for(lambda: streamer.queued() == 8, 5)
    rest[0].cancel()
    rest[1].cancel()
    time.sleep(0.2)
    for _ in range(6):
        steps.step(0.1)
    assert [call.result(5) for call in rest[2:]] == [[f"ok:a{i}"] for i in range(4, 10)]
    assert steps.batches[2:] == [["a4", "a5"], ["a6", "a7"], ["a8", "a9"]]


def test_under_overload_priority_levels_keep_their_order(closing, steps):
    """Newest first within a level; the higher level's inputs still go
    before the lower's."""
    streamer = closing(
        ThreadedStreamer(
            steps, batch_size=2, max_latency=0.01, overload_after=0.05, overload_wait=30, priority_levels=2
        )
    )
    _calls(streamer, ["hold"], priority=1)
    assert steps.started(1)
    low = _calls(streamer, ["l0", "l1", "l2", "l3"], priority=2)
    high = _calls(streamer, ["h0", "h1", "h2"], priority=1)
    assert wait_for(lambda: streamer.queued() == 7, 5)
    low[0].cancel()  # a caller leaves
    low[1].cancel()
    steps.step(0.1)  # first come first served: [h0, h1]; l0 and l1 met, dropped
    assert steps.started(2)
    steps.step(0.1)  # the queue stands: the newest of the highest level first
    steps.step()
    steps.step()
    assert [call.result(5) for call in high + low[2:]] == [["ok:h0"], ["ok:h1"], ["ok:h2"], ["ok:l2"], ["ok:l3"]]
    assert steps.batches[1:] == [["h0", "h1"], ["h2", "l3"], ["l2"]], steps.batches


def test_on_the_process_backend_a_standing_queue_callers_leave_is_served_newest_first(closing, tmp_path):
    """The same rule where the workers are processes: the web process's
    scheduler picks what it sends them."""
    streamer = closing(
        Streamer(
            models.RecordingGate,
            batch_size=2,
            max_latency=0.01,
            worker_num=1,
            overload_after=0.05,
            overload_wait=30,
            model_init_kwargs={"folder": str(tmp_path)},
        )
    )
    assert streamer.wait_ready(30)
    (tmp_path / "hold").write_text("")
    held = streamer.submit(["hold"])
    assert wait_for(lambda: (tmp_path / "inside").exists(), 10)
    ahead = streamer.submit(["a0", "a1"])
    rest = _calls(streamer, [f"a{i}" for i in range(2, 10)])
    assert wait_for(lambda: streamer.queued() == 8, 5)
    rest[0].cancel()
    rest[1].cancel()
    time.sleep(0.1)
    (tmp_path / "hold").unlink()
    assert held.result(10) == ["ok:hold"] and ahead.result(10) == ["ok:a0", "ok:a1"]
    assert [call.result(10) for call in rest[2:]] == [[f"ok:a{i}"] for i in range(4, 10)]
    batches = models.ran_batches(tmp_path)
    assert batches[:2] == [["hold"], ["a0", "a1"]] and batches[2] in (["a4", "a5"], ["a9", "a8"]), batches
    assert ["a9", "a8"] in batches and ["a6", "a7"] not in batches, "the standing queue was served in order"


def test_a_standing_queue_is_overloaded_by_two_callers_leaving_within_the_window_not_one():
    queue = StandingQueue(0.5, 2.0)
    queue.taken(True, 0.0)  # every batch since has left inputs behind
    queue.caller_left(0.6)
    assert LEAVING_MOST == 2 and not queue.overloaded(1.0), "one caller leaving is not an overload"
    queue.caller_left(0.9)
    assert queue.overloaded(1.0)
    queue.taken(False, 1.1)  # a batch took everything waiting
    assert not queue.overloaded(1.2)


def test_callers_leaving_further_apart_than_the_window_are_no_overload():
    queue = StandingQueue(0.5, 2.0)
    queue.taken(True, 0.0)
    queue.caller_left(0.0)
    queue.caller_left(LEAVING_WINDOW_S + 1.0)
    assert not queue.overloaded(LEAVING_WINDOW_S + 1.1), "the two latest left more than the window apart"
    queue.caller_left(LEAVING_WINDOW_S + 1.05)
    assert queue.overloaded(LEAVING_WINDOW_S + 1.1)


def test_a_former_that_cannot_refuse_a_call_never_sheds():
    """Where nobody can answer a refused input (a Redis worker's read-ahead,
    which has no caller to tell), the overload rule is off whatever the
    settings: it would take inputs out unrun and unanswered."""
    config = BatchingConfig(2, 0.01, overload_after=0.05, overload_wait=0.1)
    assert not BatchFormer(config, False).standing.on
    leveled = BatchingConfig(2, 0.01, priority_levels=2, overload_after=0.05)
    assert not BatchFormer(leveled, False, queue=LeveledQueue(leveled)).standing.on
    assert not Handover(config).former.standing.on
    assert BatchFormer(config, False, shed=lambda each: None).standing.on
