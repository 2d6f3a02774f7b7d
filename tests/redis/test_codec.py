"""What crosses Redis, and what is never unpickled: msgpack by default
(plain data, bytes, numpy arrays), pickle only when both sides opt in, and
payloads planted in Redis by someone else never run code."""

from __future__ import annotations

import logging
import pickle
import uuid
from fractions import Fraction

import numpy as np
import pytest

from streamer_core import SerializationError
from tests.redis import models
from tests.redis.conftest import wait_for

LOGGER = "streamer_core.redis"


def test_numpy_arrays_round_trip_with_dtype_and_shape(broker, make_streamer, start_worker):
    start_worker(broker, models.identity, batch_size=8)
    streamer = make_streamer(broker)
    arrays = [
        np.arange(6, dtype=np.float32).reshape(2, 3),
        np.arange(24, dtype=np.uint8).reshape(4, 3, 2).transpose(2, 0, 1),  # not C-contiguous
        np.array([True, False]),
        np.zeros((0, 5), dtype=">i8"),
        np.array(3.5, dtype=np.float16),  # 0-d
        np.array(["ab", "c"]),  # fixed-width unicode
    ]
    answers = streamer.predict(arrays)
    for sent, got in zip(arrays, answers):
        assert isinstance(got, np.ndarray)
        assert got.dtype == sent.dtype and got.shape == sent.shape
        np.testing.assert_array_equal(got, sent)
        assert got.flags.writeable, "a received array should be usable like any other"


def test_a_model_may_return_one_array_for_the_whole_batch(broker, make_streamer, start_worker):
    start_worker(broker, lambda batch: np.stack(batch) * 2, batch_size=8)
    streamer = make_streamer(broker)
    [a, b] = streamer.predict([np.ones(3, dtype=np.int32), np.arange(3, dtype=np.int32)])
    np.testing.assert_array_equal(a, [2, 2, 2])
    np.testing.assert_array_equal(b, [0, 2, 4])
    assert a.dtype == np.int32


def test_plain_data_and_bytes_round_trip(broker, make_streamer, start_worker):
    start_worker(broker, models.identity, batch_size=8)
    streamer = make_streamer(broker)
    values = [
        b"\x00\xff raw bytes",
        "text \u2603",
        None,
        True,
        2**62,
        -1.5,
        {"nested": [1, {"k": b"v"}], 3: "int key"},
        [],
        np.float32(1.5),  # numpy scalars arrive as Python numbers
    ]
    answers = streamer.predict(values)
    assert answers[:8] == values[:8]
    assert isinstance(answers[0], bytes)
    assert answers[8] == 1.5
    assert streamer.predict([(1, 2)]) == [[1, 2]], "tuples come back as lists"


def test_object_arrays_are_refused_before_anything_is_sent(broker, make_streamer):
    streamer = make_streamer(broker)
    with pytest.raises(SerializationError, match="objects") as info:
        streamer.submit([np.array([1, None, "x"], dtype=object)])
    assert isinstance(info.value, TypeError)
    assert broker.xlen() == 0


def test_arbitrary_objects_are_refused_by_default_with_a_hint(broker, make_streamer):
    streamer = make_streamer(broker)
    with pytest.raises(SerializationError, match=r"input 1: .*codec='pickle'"):
        streamer.submit([1, models.Point(1, 2)])
    assert broker.xlen() == 0, "no input of a refused call may be queued"


def test_a_result_that_cannot_be_sent_back_fails_only_its_caller(broker, make_streamer, start_worker):
    start_worker(broker, lambda batch: [x if x != "set" else {1, 2} for x in batch], batch_size=8)
    streamer = make_streamer(broker)
    good, bad = streamer.submit(["ok"]), streamer.submit(["set"])
    assert good.result(10) == ["ok"]
    with pytest.raises(SerializationError, match="cannot be sent back"):
        bad.result(10)


def test_pickle_on_both_sides_carries_arbitrary_objects(broker, make_streamer, start_worker):
    start_worker(broker, models.identity, batch_size=8, codec="pickle")
    streamer = make_streamer(broker, codec="pickle")
    values = [models.Point(1, 2), Fraction(1, 3), {1, 2}, (1, "tuple"), np.array([1, None], dtype=object)]
    answers = streamer.predict(values)
    assert answers[:4] == values[:4]
    assert type(answers[0]) is models.Point and type(answers[3]) is tuple
    assert answers[4].dtype == object and list(answers[4]) == [1, None]


def test_a_msgpack_worker_refuses_a_pickle_client_with_a_serialization_error(broker, make_streamer, start_worker, caplog):
    """The refusal reaches a codec="pickle" caller as a SerializationError at
    once. (Once, the web side could not read the msgpack-encoded error, and
    the call hung until its timeout.)"""
    seen = []
    start_worker(broker, lambda batch: seen.extend(batch) or batch, batch_size=8)
    streamer = make_streamer(broker, codec="pickle")
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        with pytest.raises(SerializationError, match="refuses 'pickle' payloads"):
            streamer.predict([1], timeout=2)
    assert seen == [], "a refused input must not reach the model"


def test_a_pickle_worker_refuses_a_msgpack_client(broker, make_streamer, start_worker, caplog):
    seen = []
    start_worker(broker, lambda batch: seen.extend(batch) or batch, batch_size=8, codec="pickle")
    streamer = make_streamer(broker)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        with pytest.raises(SerializationError):
            streamer.predict([1], timeout=5)
    assert seen == []
    assert any("refused a 'msgpack' payload" in r.getMessage() for r in caplog.records)


def _evil(marker) -> bytes:
    return pickle.dumps(models.Evil(str(marker)))


def test_the_planted_payload_does_run_code_when_unpickled(tmp_path):
    """The control for the tests below: unpickling it creates the marker."""
    marker = tmp_path / "control"
    pickle.loads(_evil(marker))
    assert marker.is_dir()


@pytest.mark.parametrize("codec_field", ["pickle", "msgpack"])
def test_a_pickle_planted_in_the_request_stream_is_never_unpickled(
    broker, make_streamer, start_worker, tmp_path, caplog, codec_field
):
    marker = tmp_path / "pwned"
    seen = []
    start_worker(broker, lambda batch: seen.extend(batch) or [x * 2 for x in batch], batch_size=8)
    forger = uuid.uuid4().hex
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        broker.conn.xadd(broker.requests, {"c": forger, "i": "0", "t": 60_000, "k": codec_field, "p": _evil(marker)})
        # The forger's "call" is answered with an error, not run.
        assert wait_for(lambda: broker.conn.xlen(broker.results(forger)) == 1, 5)
        [(_, answer)] = broker.conn.xrange(broker.results(forger))
        assert answer[b"ok"] == b"0"
        # And the worker keeps serving real calls.
        assert make_streamer(broker).predict([21]) == [42]
    assert not marker.exists(), "the worker unpickled a payload from Redis"
    assert seen == [21], "the planted payload must not reach the model"
    rejections = [r for r in caplog.records if r.name == LOGGER and r.levelno >= logging.WARNING
                  and ("refused" in r.getMessage() or "rejected" in r.getMessage())]
    assert rejections, "the rejection should be logged"
    assert broker.xlen() == 0 and broker.pending() == 0


def test_malformed_requests_are_dropped_and_logged(broker, make_streamer, start_worker, caplog):
    seen = []
    start_worker(broker, lambda batch: seen.extend(batch) or batch, batch_size=8)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        broker.conn.xadd(broker.requests, {"c": "x", "i": "0"})  # no timeout, codec or payload
        broker.conn.xadd(broker.requests, {"c": "x", "i": "1", "t": "soon", "k": "msgpack", "p": b"\x01"})
        assert make_streamer(broker).predict([5]) == [5]
    assert seen == [5]
    assert sum("malformed" in r.getMessage() for r in caplog.records) == 2
    assert broker.xlen() == 0 and broker.pending() == 0


@pytest.mark.parametrize("codec_field", [None, "pickle", "msgpack"])
def test_a_forged_answer_is_never_unpickled_by_the_web_side(broker, make_streamer, tmp_path, caplog, codec_field):
    marker = tmp_path / "pwned"
    streamer = make_streamer(broker)  # msgpack; no worker: the test answers in its place
    future = streamer.submit([1])
    broker.wait_queued(1)
    [(_, request)] = broker.conn.xrange(broker.requests)
    client, item = request[b"c"].decode(), request[b"i"]
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        answer = {"i": item, "ok": "1", "p": _evil(marker)}
        if codec_field is not None:
            answer["k"] = codec_field
        broker.conn.xadd(broker.results(client), answer)
        with pytest.raises(SerializationError, match="could not be read"):
            future.result(5)
    assert not marker.exists(), "the web process unpickled an answer from Redis"
    assert any("refused a result" in r.getMessage() for r in caplog.records)
