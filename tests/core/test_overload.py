"""A bounded queue refuses work at once instead of queueing without limit."""

from __future__ import annotations

import time

import pytest

from streamer_core import QueueFullError, ThreadedStreamer, UnavailableError


def test_a_full_queue_refuses_calls_at_once(closing, gate):
    streamer = closing(ThreadedStreamer(gate, batch_size=2, max_latency=0.01, max_queue=4))
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
    streamer = closing(ThreadedStreamer(gate, batch_size=2, max_latency=0.01, max_queue=2))
    streamer.submit(["hold"])
    assert gate.entered.wait(5)
    for _ in range(2):
        streamer.submit(["gone"], timeout=0.05)
    time.sleep(0.2)
    assert streamer.submit(["fits"]) is not None
