"""A bounded queue refuses work at once instead of queueing without limit."""

from __future__ import annotations

import time

import pytest

from streamer_core import QueueFullError, StreamerTimeoutError, ThreadedStreamer, UnavailableError

# Batches larger than the queue: a full batch waiting would be handed ahead to
# the busy model, out of the queue, and the queue would never be full.


def test_a_full_queue_refuses_calls_at_once(closing, gate):
    streamer = closing(ThreadedStreamer(gate, batch_size=8, max_latency=0.01, max_queue=4))
    running = streamer.submit(["hold"])
    assert gate.entered.wait(5)
    accepted = [streamer.submit([f"q{i}"]) for i in range(4)]
    started = time.monotonic()
    with pytest.raises(QueueFullError, match="max_queue is 4") as info:
        streamer.predict(["one too many"])
    assert time.monotonic() - started < 0.5, "an overload error must come at once"
    assert isinstance(info.value, UnavailableError)
    with pytest.raises(QueueFullError):
        streamer.submit(["a", "b"])  # a call of several items counts them all
    gate.release()
    assert running.result(5) == ["ok:hold"]
    assert [f.result(5) for f in accepted] == [[f"ok:q{i}"] for i in range(4)]
    assert streamer.predict(["room again"]) == ["ok:room again"]
    assert "one too many" not in gate.seen()


def test_given_up_calls_free_their_place_in_the_queue(closing, gate):
    streamer = closing(ThreadedStreamer(gate, batch_size=8, max_latency=0.01, max_queue=2))
    running = streamer.submit(["hold"])
    assert gate.entered.wait(5)
    gone = [streamer.submit(["gone"], timeout=1.0) for _ in range(2)]
    with pytest.raises(QueueFullError):
        streamer.submit(["no room yet"])  # long before they time out
    for future in gone:
        with pytest.raises(StreamerTimeoutError):
            future.result(3)
    fits = streamer.submit(["fits"])  # their places are free: no QueueFullError
    gate.release()
    assert running.result(5) == ["ok:hold"] and fits.result(5) == ["ok:fits"]
    assert "gone" not in gate.seen(), "calls given up on never reach the model"


def test_a_call_of_several_inputs_that_would_overflow_a_queue_with_room_is_refused_whole(closing, gate):
    """Two of four places are taken: a call of three inputs does not fit and
    is refused, none of its inputs queued; a call of two fits exactly."""
    streamer = closing(ThreadedStreamer(gate, batch_size=8, max_latency=0.01, max_queue=4))
    running = streamer.submit(["hold"])
    assert gate.entered.wait(5)
    queued = [streamer.submit([f"q{i}"]) for i in range(2)]
    assert streamer.queued() == 2
    with pytest.raises(QueueFullError, match="max_queue is 4"):
        streamer.submit(["a", "b", "c"])
    assert streamer.queued() == 2, "no input of a refused call may be queued"
    fits = streamer.submit(["d", "e"])
    assert streamer.queued() == 4
    gate.release()
    assert running.result(5) == ["ok:hold"]
    assert [f.result(5) for f in queued] == [["ok:q0"], ["ok:q1"]]
    assert fits.result(5) == ["ok:d", "ok:e"]
    assert not {"a", "b", "c"} & set(gate.seen())
