"""What crosses Redis, and what is never unpickled: msgpack by default
(plain data, bytes, numpy arrays), pickle only when both sides opt in, and
payloads planted in Redis by someone else never run code."""

from __future__ import annotations

import logging
import pickle
import uuid
from fractions import Fraction
from typing import Any, List

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streamer_core import BatchLengthError, RemoteError, RemoteTraceback, SerializationError, StreamerTimeoutError
from tests.helpers import needs_shortcut
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


def test_a_msgpack_worker_refuses_a_pickle_client_with_a_serialization_error(
    broker, make_streamer, start_worker, caplog
):
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
    [line] = [
        r.getMessage() for r in caplog.records if r.name == LOGGER and "refused a 'pickle' payload" in r.getMessage()
    ]
    assert "start it with codec='pickle'" in line and "trusted" in line, "the refusal says how to opt in, and when"


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
    rejections = [
        r
        for r in caplog.records
        if r.name == LOGGER
        and r.levelno >= logging.WARNING
        and ("refused" in r.getMessage() or "rejected" in r.getMessage())
    ]
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
    # Matched on level and phrase: the worker's start-up line names the model,
    # a lambda whose qualified name holds this test's name.
    dropped = [r for r in caplog.records if r.levelno >= logging.WARNING and "dropped malformed" in r.getMessage()]
    assert len(dropped) == 2
    assert broker.xlen() == 0 and broker.pending() == 0


@pytest.mark.parametrize("codec_field", ["pickle", "msgpack"])
def test_a_forged_answer_is_never_unpickled_by_the_web_side(broker, make_streamer, tmp_path, caplog, codec_field):
    marker = tmp_path / "pwned"
    streamer = make_streamer(broker)  # msgpack; no worker: the test answers in its place
    future = streamer.submit([1])
    broker.wait_queued(1)
    [(_, request)] = broker.conn.xrange(broker.requests)
    client, item = request[b"c"].decode(), request[b"i"]
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        broker.conn.xadd(broker.results(client), {"i": item, "ok": "1", "k": codec_field, "p": _evil(marker)})
        with pytest.raises(SerializationError, match="could not be read"):
            future.result(5)
    assert not marker.exists(), "the web process unpickled an answer from Redis"
    assert any("refused a result" in r.getMessage() for r in caplog.records)


def test_a_forged_answer_without_a_codec_is_dead_lettered_and_the_call_waits_on(broker, make_streamer, tmp_path):
    """No version of the project writes an answer without its codec: such
    an entry is malformed, even with the call's own request id. It is moved
    to the dead-letter stream, never read, and the call goes on waiting for
    its real answer."""
    marker = tmp_path / "pwned"
    streamer = make_streamer(broker)
    future = streamer.submit([1], timeout=1.5)
    broker.wait_queued(1)
    [(_, request)] = broker.conn.xrange(broker.requests)
    client, item = request[b"c"].decode(), request[b"i"]
    broker.conn.xadd(broker.results(client), {"i": item, "ok": "1", "p": _evil(marker)})
    assert wait_for(lambda: broker.conn.xlen(f"streamer:{broker.prefix}:dead") == 1, 3)
    assert not future.done(), "a malformed entry must not complete the call"
    with pytest.raises(StreamerTimeoutError):
        future.result(3)
    assert not marker.exists(), "the web process unpickled an answer from Redis"


# -- large arrays: out of band, copied once on each side -----------------------------------


@pytest.mark.parametrize("codec", ["msgpack", "pickle"])
def test_large_arrays_round_trip_out_of_band(broker, make_streamer, start_worker, codec):
    start_worker(broker, models.identity, batch_size=8, codec=codec)
    streamer = make_streamer(broker, codec=codec)
    rng = np.random.default_rng(0)
    image = rng.random((3, 224, 224), dtype=np.float32)
    values = [
        image,
        {"a": image * 2, "b": [np.arange(100_000, dtype=np.int64), "text"]},
        np.asfortranarray(rng.random((300, 300))),  # not C-contiguous
        image[:, ::2, :],  # a strided view
    ]
    answers = streamer.predict(values)
    np.testing.assert_array_equal(answers[0], image)
    np.testing.assert_array_equal(answers[1]["a"], image * 2)
    np.testing.assert_array_equal(answers[1]["b"][0], np.arange(100_000, dtype=np.int64))
    assert answers[1]["b"][1] == "text"
    np.testing.assert_array_equal(answers[2], values[2])
    np.testing.assert_array_equal(answers[3], values[3])
    assert all(a.flags.writeable for a in (answers[0], answers[1]["a"], answers[2], answers[3]))


def test_a_large_array_travels_beside_the_payload_not_inside_it(broker, make_streamer):
    streamer = make_streamer(broker)  # no worker: look at the request as Redis holds it
    image = np.ones((3, 224, 224), dtype=np.float32)
    streamer.submit([image])
    broker.wait_queued(1)
    [(_, fields)] = broker.conn.xrange(broker.requests)
    assert len(fields[b"p"]) < 100, "the payload holds the array's dtype and shape, not its bytes"
    assert fields[b"b0"] == image.tobytes()


def test_an_array_is_copied_once_to_encode_and_once_to_decode():
    """Measured by allocation: encoding allocates the array's size once
    (its bytes, taken when the call is made) and decoding once (the array
    handed to the model, writable); nothing more that scales with it. (The
    array is large, so that msgpack's fixed 256 KiB packing buffer does not
    count.)"""
    import tracemalloc

    from streamer_core.codec import get_codec

    image = np.ones((4096, 1024), dtype=np.float32)  # 16 MiB
    for name in ("msgpack", "pickle"):
        codec = get_codec(name)
        tracemalloc.start()
        payload, buffers = codec.dumps({"image": image})
        encode_peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.reset_peak()
        value = codec.loads(payload, buffers)
        decode_peak = tracemalloc.get_traced_memory()[1] - sum(len(b) for b in buffers)
        tracemalloc.stop()
        assert encode_peak < 1.2 * image.nbytes, (name, encode_peak)
        assert decode_peak < 1.2 * image.nbytes, (name, decode_peak)
        np.testing.assert_array_equal(value["image"], image)


def _our_packer() -> Any:
    """The command packer our connections are given where the redis-packing
    shortcut is on (taken by hand here: the tests of what it packs)."""
    from streamer_core.backends.redis.connection import _large_value_packer

    packer = _large_value_packer()
    if packer is None:
        pytest.skip("this redis-py packs with its own Python packer, which passes large values through")
    return packer


@pytest.mark.parametrize("switch", ["1", "0"])
def test_a_connection_packs_with_ours_only_where_the_shortcut_is_on(monkeypatch, switch):
    from streamer_core import shortcuts
    from streamer_core.backends.redis.connection import connect
    from streamer_core.options.redis_address import RedisAddress

    monkeypatch.setenv("STREAMER_SHORTCUTS", switch)
    packer = connect(RedisAddress.parse("127.0.0.1:6379")).connection_pool.connection_kwargs.get("command_packer")
    assert (packer is not None) is (switch == "1" and shortcuts.release_problem("redis-packing") is None)


@needs_shortcut("redis-packing", switch=False)
def test_redis_py_sends_a_large_value_without_copying_it():
    """With hiredis, redis-py would pack each argument into one buffer per
    command; our connections hand a large value to the socket as it is."""
    packer = _our_packer()
    payload = b"x" * (1 << 20)
    assert any(chunk is payload for chunk in packer.pack("XADD", "k", "*", "p", payload))
    small = packer.pack("XADD", "k", "*", "p", b"small")
    assert len(small) == 1 and b"small" in small[0], "small commands are packed in one piece, as before"


_ARGUMENTS = st.lists(
    st.one_of(
        st.text(max_size=20),
        st.binary(max_size=20),
        st.binary(max_size=20).map(bytearray),
        st.binary(max_size=20).map(memoryview),
        st.integers(-(2**63), 2**63 - 1),
        st.floats(allow_nan=False),
    ),
    max_size=30,
)


@needs_shortcut("redis-packing", switch=False)
@settings(max_examples=300, deadline=None)
@given(name=st.sampled_from(["XADD", "SCRIPT LOAD", b"EVALSHA", b"CLIENT SETNAME"]), arguments=_ARGUMENTS)
def test_our_packer_writes_what_redis_py_writes(name: Any, arguments: List[Any]) -> None:
    """Small commands take a shorter path through our packer than through
    redis-py's own; the bytes on the wire are the same."""
    import redis.connection

    theirs = redis.connection.HiredisRespSerializer()
    assert b"".join(_our_packer().pack(name, *arguments)) == b"".join(theirs.pack(name, *arguments))


@needs_shortcut("redis-packing", switch=False)
def test_our_packer_refuses_what_redis_py_refuses():
    import redis

    with pytest.raises(redis.DataError):
        _our_packer().pack("SET", "k", None)


# The codec on its own, without a broker: what each value becomes, and what a
# forged payload or error can and cannot turn into.


def test_numpy_scalars_become_plain_numbers_and_layout_is_kept():
    from streamer_core.codec import get_codec

    codec = get_codec("msgpack")
    value = codec.decode(codec.encode([np.float32(1.5), np.int64(7), np.bool_(True)]))
    assert value == [1.5, 7, True]
    assert [type(item) for item in value] == [float, int, bool]
    fortran = np.asfortranarray(np.arange(12, dtype=np.int16).reshape(3, 4))
    sliced = np.arange(40, dtype=np.float64).reshape(4, 10)[:, ::3]  # neither C nor Fortran contiguous
    for array in (fortran, sliced):
        for payload, buffers in (codec.dumps(array), (codec.encode(array), ())):
            back = codec.loads(payload, buffers)
            np.testing.assert_array_equal(back, array)
            assert back.dtype == array.dtype and back.shape == array.shape


def test_pickle_codec_keeps_small_and_non_contiguous_buffers_in_the_payload():
    from streamer_core.codec import OUT_OF_BAND_BYTES, get_codec

    codec = get_codec("pickle")
    small = np.arange(10, dtype=np.int32)
    strided = np.arange(OUT_OF_BAND_BYTES, dtype=np.int64)[::2]  # large, not contiguous
    large = np.ones(OUT_OF_BAND_BYTES, dtype=np.uint8)
    payload, buffers = codec.dumps({"small": small, "strided": strided, "large": large})
    assert buffers == (large.tobytes(),), "only the large contiguous array travels beside the payload"
    back = codec.loads(payload, buffers)
    for name, array in (("small", small), ("strided", strided), ("large", large)):
        np.testing.assert_array_equal(back[name], array)


@pytest.mark.parametrize("codec_name", ["msgpack", "pickle"])
def test_a_value_that_cannot_be_written_is_named_in_the_error(codec_name):
    import threading

    from streamer_core.codec import get_codec

    codec = get_codec(codec_name)
    if codec_name == "msgpack":
        value, expected = (
            {"x": [Fraction(1, 3)]},
            r"^dict cannot be written with the msgpack codec \(cannot encode Fraction\)",
        )
    else:
        value, expected = threading.Lock(), r"^lock cannot be pickled"
    for write in (codec.encode, codec.dumps):
        with pytest.raises(SerializationError, match=expected):
            write(value)


def test_forged_msgpack_payloads_fail_with_a_serialization_error():
    import msgpack

    from streamer_core.codec import get_codec

    codec = get_codec("msgpack")
    header = msgpack.packb(["<f4", [2]])
    cases = {
        "unknown msgpack extension type 9": msgpack.packb(msgpack.ExtType(9, b"")),
        "names a buffer that was not sent": msgpack.packb(msgpack.ExtType(2, msgpack.packb(["<f4", [2], 1]))),
        "refusing a numpy array of Python objects": msgpack.packb(msgpack.ExtType(1, msgpack.packb(["|O", [1]]))),
        "not a valid msgpack payload": b"\xc1",
    }
    for expected, payload in cases.items():
        with pytest.raises(SerializationError, match=expected):
            codec.loads(payload, (b"\0" * 8,))
    assert codec.loads(msgpack.packb(msgpack.ExtType(2, msgpack.packb(["<f4", [2], 0]))), (b"\0" * 8,)).shape == (2,)
    assert codec.loads(msgpack.packb(msgpack.ExtType(1, header + b"\0" * 8))).tolist() == [0.0, 0.0]


def test_an_unknown_codec_name_lists_the_known_ones():
    from streamer_core.codec import get_codec

    with pytest.raises(
        ValueError, match=r"codec must be 'msgpack' or 'pickle' \(pickle only with a trusted broker\), got 'json'"
    ):
        get_codec("json")


def _raised(exc: BaseException) -> BaseException:
    try:
        raise exc
    except BaseException as caught:
        return caught


@pytest.mark.parametrize(
    "original",
    [ValueError("bad input 3"), KeyError("missing"), BatchLengthError("3 results for 4 inputs")],
    ids=lambda exc: type(exc).__name__,
)
def test_errors_cross_as_their_own_type_with_the_remote_traceback(original):
    from streamer_core.codec import decode_error, encode_error, get_codec

    codec = get_codec("msgpack")
    data = codec.decode(codec.encode(encode_error(_raised(original))))
    # The message is the one argument, so the type made again from it reads the
    # same; str() of a KeyError quotes its key, and quoting it twice was a bug.
    assert data["type"] == type(original).__name__ and data["message"] == original.args[0]
    assert data["traceback"].startswith("Traceback (most recent call last):")
    assert f"{type(original).__name__}: {original}" in data["traceback"]
    assert "_raised" in data["traceback"]
    back = decode_error(data)
    assert type(back) is type(original) and str(back) == str(original)
    assert isinstance(back.__cause__, RemoteTraceback) and back.__cause__.tb == data["traceback"]


def test_errors_without_a_type_here_become_remote_errors():
    from streamer_core.codec import decode_error

    class OddError(Exception):
        pass

    cases = {
        "OddError": "OddError: odd",  # defined only in the worker
        "print": "print: odd",  # a builtin, not an exception type
        "SystemExit": "SystemExit: odd",  # never re-raised here: would stop the web process
        "KeyboardInterrupt": "KeyboardInterrupt: odd",
        "UnicodeDecodeError": "UnicodeDecodeError: odd",  # cannot be built from a message
        "RemoteError": "RemoteError: odd",
        "__class__": "__class__: odd",  # an attribute of streamer_core.errors, not an error in it
    }
    for name, expected in cases.items():
        back = decode_error({"type": name, "message": "odd", "traceback": "tb"})
        assert type(back) is RemoteError and str(back) == expected and back.exc_type == name, name
        assert back.__cause__.tb == "tb"
    bare = decode_error({})
    assert type(bare) is Exception and str(bare) == "" and bare.__cause__.tb == ""
    assert not isinstance(OddError, type(bare))


def test_an_error_payload_that_is_not_a_mapping_is_reported_not_raised_as_is():
    from streamer_core.codec import decode_error

    back = decode_error(["x" * 500])
    assert type(back) is RemoteError and back.exc_type == "InvalidErrorPayload"
    assert str(back) == "InvalidErrorPayload: " + repr(["x" * 500])[:200]


def test_any_forged_error_decodes_to_an_ordinary_exception():
    """Whatever a forged answer names, the web side gets an Exception (never
    SystemExit, KeyboardInterrupt or a non-exception) carrying its message."""
    import builtins

    from hypothesis import given, settings
    from hypothesis import strategies as st

    from streamer_core import errors
    from streamer_core.codec import decode_error

    names = st.sampled_from(sorted(set(dir(builtins)) | set(dir(errors)))) | st.text(max_size=20)
    fields = st.fixed_dictionaries(
        {}, optional={"type": names, "message": st.text(max_size=50), "traceback": st.text()}
    )

    @settings(max_examples=300, deadline=None, database=None)
    @given(fields | st.none() | st.integers() | st.lists(st.text(), max_size=3))
    def check(data):
        exc = decode_error(data)
        assert isinstance(exc, Exception)
        if isinstance(data, dict):
            # Carried as the exception's argument; KeyError's text is its
            # argument's repr ("'\\x1f'" for "\x1f"), so the text alone cannot say.
            message = str(data.get("message", ""))
            assert exc.args[:1] == (message,) or message in str(exc), (exc.args, str(exc))
            assert isinstance(exc.__cause__, RemoteTraceback) and exc.__cause__.tb == data.get("traceback", "")

    check()


def test_a_model_error_reaches_a_pickle_caller_as_its_own_type(broker, make_streamer, start_worker):
    """Errors always cross as msgpack, whatever the answers' codec: with
    codec="pickle" on both sides, a model's ValueError still reaches its
    caller as a ValueError with the model's message (read with the answers'
    codec, it was unreadable), and a good input beside it is answered."""

    def model(batch: List[Any]) -> List[Any]:
        if "bad" in batch:
            raise ValueError("bad input from the model")
        return [models.Point(len(x), 0) for x in batch]

    start_worker(broker, model, batch_size=8, codec="pickle")
    streamer = make_streamer(broker, codec="pickle")
    with pytest.raises(ValueError, match="^bad input from the model$"):
        streamer.predict(["bad"], timeout=10)
    assert streamer.predict(["good"], timeout=10) == [models.Point(4, 0)]
