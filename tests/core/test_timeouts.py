"""Per-call timeouts: a TimeoutError subclass, the item dropped before the
model, and nothing kept in memory for calls that were given up."""

from __future__ import annotations

import concurrent.futures
import gc
import re
import threading
import time
import tracemalloc

import pytest

from streamer_core import StreamerTimeoutError, ThreadedStreamer
from tests.helpers import wait_for


def test_predict_timeout_raises_a_timeout_error_subclass(closing, gate):
    streamer = closing(ThreadedStreamer(gate, batch_size=4, max_latency=0.01))
    started = time.monotonic()
    with pytest.raises(StreamerTimeoutError) as info:
        streamer.predict(["hold"], timeout=0.2)
    elapsed = time.monotonic() - started
    assert isinstance(info.value, TimeoutError)
    assert 0.15 < elapsed < 2.0


def test_future_result_timeout_gives_the_call_up(closing, gate):
    streamer = closing(ThreadedStreamer(gate, batch_size=4, max_latency=0.01))
    streamer.submit(["hold"])
    assert gate.entered.wait(5)
    future = streamer.submit(["late"])
    with pytest.raises(TimeoutError):
        future.result(timeout=0.1)
    assert future.cancelled()
    gate.release()
    assert streamer.predict(["after"]) == ["ok:after"]
    assert "late" not in gate.seen(), "a call its caller gave up on still reached the model"


def test_a_timed_out_item_is_dropped_before_it_reaches_the_model(closing, gate):
    streamer = closing(ThreadedStreamer(gate, batch_size=4, max_latency=0.01))
    streamer.submit(["hold"])
    assert gate.entered.wait(5)
    with pytest.raises(StreamerTimeoutError):
        streamer.predict(["too-late"], timeout=0.1)
    gate.release()
    assert streamer.predict(["after"]) == ["ok:after"]
    assert "too-late" not in gate.seen()


def test_result_without_timeout_still_returns_by_the_calls_deadline(closing, gate):
    """A submit() future completes at the streamer's timeout even if nobody
    waits on it with a timeout: no code path waits forever."""
    streamer = closing(ThreadedStreamer(gate, batch_size=4, max_latency=0.01, timeout=0.3))
    future = streamer.submit(["hold"])
    started = time.monotonic()
    with pytest.raises(StreamerTimeoutError):
        future.result()
    assert time.monotonic() - started < 2.0
    done_callback_fired = []
    other = streamer.submit(["x"])
    other.add_done_callback(done_callback_fired.append)
    deadline = time.monotonic() + 3
    while not done_callback_fired and time.monotonic() < deadline:
        time.sleep(0.01)
    assert done_callback_fired, "the future was never completed"
    assert isinstance(other.exception(0), StreamerTimeoutError)


def test_a_hour_long_model_call_does_not_hold_a_submit_future(closing, gate):
    streamer = closing(ThreadedStreamer(gate, batch_size=4, max_latency=0.01))
    future = streamer.submit(["hold"], timeout=0.2)
    with pytest.raises(StreamerTimeoutError):
        future.result()


def test_100k_timed_out_calls_leave_memory_flat(closing, gate):
    """Calls that time out while the model is busy leave nothing behind: not
    in the queue, not in the deadline bookkeeping, not in memory."""
    streamer = closing(ThreadedStreamer(gate, batch_size=64, max_latency=0.01))
    streamer.submit(["hold"], timeout=60)
    assert gate.entered.wait(5)

    def expire(n: int) -> None:
        # The streamer's own deadline fails these; nobody waits on them.
        for i in range(n):
            streamer.submit([i], timeout=0.001)
        # And callers that give up on their own wait (the cancel path).
        for i in range(n // 20):
            with pytest.raises(StreamerTimeoutError):
                streamer.predict([-i], timeout=0.0001)
        deadline = time.monotonic() + 10
        while streamer.queued() > 0 and time.monotonic() < deadline:
            time.sleep(0.02)

    expire(5_000)  # warm up: caches, the deadline heap's first sweep
    gc.collect()
    tracemalloc.start()
    try:
        before, _ = tracemalloc.get_traced_memory()
        expire(100_000)
        gc.collect()
        after, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert streamer.queued() == 0, f"{streamer.queued()} timed-out items are still queued"
    # Keeping anything per call would cost several MB (100k calls x ~100 bytes at least).
    assert after - before < 1_000_000, f"memory grew by {after - before} bytes over 100k timed-out calls"
    gate.release()
    assert streamer.predict(["after"]) == ["ok:after"]
    assert gate.seen() == ["hold", "after"], "timed-out calls reached the model"


def test_invalid_timeouts_are_refused(closing):
    streamer = closing(ThreadedStreamer(lambda b: b, batch_size=4))
    for bad in (0, -1, float("inf"), float("nan")):
        with pytest.raises(ValueError, match="timeout is in seconds"):
            streamer.predict([1], timeout=bad)
    with pytest.raises(TypeError, match="timeout is in seconds"):
        streamer.predict([1], timeout="5")


def test_cancel_follows_the_future_contract_and_wakes_a_waiting_caller(closing, gate):
    """``cancel()`` as concurrent.futures defines it: True for a call not yet
    done (and again for one already cancelled), False for one that finished;
    a caller already blocked in ``result()`` wakes at once with
    CancelledError rather than waiting out the call's timeout."""
    streamer = closing(ThreadedStreamer(gate, batch_size=4, max_latency=0.01, timeout=30))
    streamer.submit(["hold"])
    assert gate.entered.wait(5)
    queued = streamer.submit(["queued"])
    woke: list = []

    def wait() -> None:
        started = time.monotonic()
        try:
            queued.result()
        except BaseException as exc:  # noqa: BLE001 - the type is what the test checks
            woke.append((type(exc), time.monotonic() - started))

    waiter = threading.Thread(target=wait)
    waiter.start()
    time.sleep(0.1)
    assert queued.cancel() is True and queued.cancelled()
    waiter.join(5)
    assert woke and woke[0][0] is concurrent.futures.CancelledError, woke
    assert woke[0][1] < 2.0, "the waiting caller slept on after the cancel"
    assert queued.cancel() is True, "cancelling a cancelled call again says it is cancelled"
    gate.release()
    done = streamer.submit(["done"])
    assert done.result(5) == ["ok:done"]
    assert done.cancel() is False and not done.cancelled(), "a finished call cannot be cancelled"
    assert "queued" not in gate.seen()


def test_exception_waits_as_result_does(closing, gate):
    """``exception(timeout)`` is None for a call that succeeded, the model's
    error for one that failed, and, while the call is pending, gives the call
    up after ``timeout`` seconds, as ``result(timeout)`` does."""

    def model(batch):
        if "bad" in batch:
            raise ValueError("bad input")
        return gate(batch)

    streamer = closing(ThreadedStreamer(model, batch_size=4, max_latency=0.01, timeout=30))
    assert streamer.submit(["fine"]).exception(5) is None
    error = streamer.submit(["bad"]).exception(5)
    assert isinstance(error, ValueError) and "bad input" in str(error)
    streamer.submit(["hold"])
    assert gate.entered.wait(5)
    pending = streamer.submit(["late"])
    started = time.monotonic()
    with pytest.raises(StreamerTimeoutError):
        pending.exception(timeout=0.2)
    assert 0.15 < time.monotonic() - started < 2.0
    assert pending.cancelled()


@pytest.mark.parametrize("backend", ["thread", "process"])
def test_the_dispatcher_fails_an_overdue_call_at_its_deadline_with_nobody_waiting(closing, gate, tmp_path, backend):
    """A call past its deadline is failed by the dispatcher then, whatever
    its caller does: its future is done (StreamerTimeoutError) for
    ``as_completed``, callbacks and ``asyncio.wrap_future`` with no one in
    ``result()``, which would give up by itself only a second later."""
    from streamer_core import Streamer
    from tests.core import models

    if backend == "thread":
        streamer = closing(ThreadedStreamer(gate, batch_size=4, max_latency=0.01))
        streamer.submit(["hold"])
        assert gate.entered.wait(5)
    else:
        streamer = closing(Streamer(models.HoldModel, 4, 0.01, model_init_kwargs={"folder": str(tmp_path)}))
        assert streamer.wait_ready(30)
        (tmp_path / "hold").write_text("")
        streamer.submit([1])
        assert wait_for(lambda: list(tmp_path.glob("inside-*")), 10), "the batch never reached the model"
    called = threading.Event()
    submitted = time.monotonic()
    future = streamer.submit(["late" if backend == "thread" else 2], timeout=0.3)
    future.add_done_callback(lambda _f: called.set())
    assert called.wait(0.3 + 0.35), "the call was still running well past its deadline"
    assert time.monotonic() - submitted < 0.3 + 0.35
    assert isinstance(future.exception(0), StreamerTimeoutError)
    gate.release()
    (tmp_path / "hold").unlink(missing_ok=True)


def _slow_recorder(ran: list) -> object:
    def model(batch: list) -> list:
        ran.extend(batch)
        time.sleep(0.3)
        return batch

    return model


def test_an_input_that_could_not_be_answered_in_time_is_not_run_and_its_call_fails_at_once(closing):
    """A batch takes 0.3 s (learned from the three before): a call with
    0.4 s left that must wait for the batch running, then run its own, would
    be answered after its deadline. It is not run, and fails as its batch
    forms, not at its deadline; a call with time enough runs."""
    ran: list = []
    streamer = closing(ThreadedStreamer(_slow_recorder(ran), batch_size=1, max_latency=0.0, timeout=10))
    assert [streamer.predict([f"learn{i}"]) for i in range(3)] == [["learn0"], ["learn1"], ["learn2"]]
    expired = streamer.stats().dropped["expired"]
    running = streamer.submit(["running"])
    assert wait_for(lambda: "running" in ran, 5)
    started = time.monotonic()
    with pytest.raises(StreamerTimeoutError, match="could not finish within its timeout of 0.4s"):
        streamer.predict(["late"], timeout=0.4)
    assert time.monotonic() - started < 0.25, "failed as its batch formed, not at its deadline"
    assert streamer.predict(["in time"], timeout=2) == ["in time"]
    assert running.result(5) == ["running"]
    assert "late" not in ran and streamer.stats().dropped["expired"] == expired + 1


def test_a_call_shorter_than_the_models_fastest_batch_is_not_run(closing):
    ran: list = []
    streamer = closing(ThreadedStreamer(_slow_recorder(ran), batch_size=4, max_latency=0.0, timeout=10))
    for n in range(3):  # fewer than three batches tell nothing yet: each runs, and answers too late
        with pytest.raises(StreamerTimeoutError):
            streamer.predict([f"first{n}"], timeout=0.2)
        time.sleep(0.3)  # its batch ends
    assert ran == ["first0", "first1", "first2"]
    started = time.monotonic()
    with pytest.raises(StreamerTimeoutError, match="it was not run"):
        streamer.predict(["short"], timeout=0.2)
    assert time.monotonic() - started < 0.15 and "short" not in ran


def test_a_call_of_many_inputs_cut_short_says_how_many_were_answered_not_that_none_ran(closing):
    """Batches of 2 take 0.3 s: of a call of 8 inputs with 1 s, the first
    batches run and the inputs still queued when the rest could not end in
    time are dropped. Its error says so, not that the call was not run."""
    ran: list = []
    streamer = closing(ThreadedStreamer(_slow_recorder(ran), batch_size=2, max_latency=0.0, timeout=10))
    assert [streamer.predict([f"learn{i}"]) for i in range(3)] == [["learn0"], ["learn1"], ["learn2"]]
    with pytest.raises(StreamerTimeoutError) as raised:
        streamer.predict([f"x{i}" for i in range(8)], timeout=1.0)
    message = str(raised.value)
    assert "it was not run" not in message, message
    found = re.search(r"its inputs still queued were not run \((\d) of its 8 had been answered\)", message)
    assert found and 0 < int(found.group(1)) < 8, message
    time.sleep(0.4)  # a batch running as the call failed ends
    assert "x7" not in ran and "x0" in ran


def test_the_fastest_recent_batch_decides_so_a_call_that_could_make_it_runs(closing):
    """After a batch of 0.1 s and one of 0.6 s, a call with 0.3 s is run:
    only an input that even the fastest batch could not answer is late."""

    def model(batch: list) -> list:
        time.sleep(0.6 if "slow" in batch else 0.1)
        return batch

    streamer = closing(ThreadedStreamer(model, batch_size=4, max_latency=0.0, timeout=10))
    assert [streamer.predict([x]) for x in ("fast", "slow", "slow")] == [["fast"], ["slow"], ["slow"]]
    assert streamer.predict(["in time"], timeout=0.3) == ["in time"]


def test_an_estimate_of_stale_batches_drops_nothing(closing, monkeypatch):
    """Batches that ended more than 10 s ago tell nothing of the next one:
    a model left idle (by this rule, or by nobody calling) runs again."""
    import streamer_core.batching.hold

    ran: list = []
    streamer = closing(ThreadedStreamer(_slow_recorder(ran), batch_size=4, max_latency=0.0, timeout=10))
    assert [streamer.predict([n]) for n in range(3)] == [[0], [1], [2]]
    with pytest.raises(StreamerTimeoutError, match="it was not run"):
        streamer.predict(["short"], timeout=0.2)
    monkeypatch.setattr(streamer_core.batching.hold, "_FRESH_S", 0.1)  # as if ten seconds had passed
    time.sleep(0.2)
    with pytest.raises(StreamerTimeoutError):
        streamer.predict(["stale"], timeout=0.2)
    assert "stale" in ran, "run: nothing fresh said it could not be answered in time"


def test_every_thread_waiting_on_one_future_gets_its_result_when_it_ends(closing, gate):
    """A future several threads wait on (``result()`` with no timeout) wakes
    them all as it ends, not the first while the rest sit out the call's
    whole deadline."""
    streamer = closing(ThreadedStreamer(gate, batch_size=4, max_latency=0.01, timeout=30))
    future = streamer.submit(["hold"])
    assert gate.entered.wait(5)
    answers = []
    waiters = [threading.Thread(target=lambda: answers.append(future.result())) for _ in range(3)]
    for waiter in waiters:
        waiter.start()
    time.sleep(0.2)  # all three are waiting
    started = time.monotonic()
    gate.release()
    for waiter in waiters:
        waiter.join(10)
    assert answers == [["ok:hold"]] * 3
    assert time.monotonic() - started < 3.0, "a waiter was woken only by its deadline"
