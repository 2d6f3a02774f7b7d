"""Anything written under the prefix by someone else: entries that do not
parse, answers for calls nobody made, keys of the wrong Redis type, entries
of other versions of the project. Nothing stops a web process or a worker:
each bad entry is logged once (its key and id, never its payload), kept cut
short in the dead-letter stream ``streamer:<prefix>:dead``, acknowledged and
deleted, and reading goes on past it."""

from __future__ import annotations

import logging
import re
import threading
import time
from typing import Any, Dict, List, Tuple

import msgpack
import pytest

from streamer_core import SerializationError
from tests.conftest import Gate
from tests.redis.conftest import GROUP, wait_for

LOGGER = "streamer_core.redis"
SECRET = b"a-payload-that-must-never-be-logged"


def double(batch: List[Any]) -> List[Any]:
    return [x * 2 for x in batch]


def dead_letters(broker) -> List[Dict[bytes, bytes]]:
    return [fields for _, fields in broker.conn.xrange(f"streamer:{broker.prefix}:dead")]


def malformed_logs(caplog) -> List[str]:
    """The warnings about dropped entries. Matched on level and phrase, not on
    the word "malformed" alone: a worker's start-up line names its model, and
    these tests' models are lambdas whose qualified names say "malformed"."""
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == LOGGER and r.levelno >= logging.WARNING and "dropped malformed entry" in r.getMessage()
    ]


def a_call_held_in_the_model(broker, make_streamer, start_worker) -> Tuple[Gate, Any, str, Any]:
    """A worker whose model holds the call ``["hold"]`` until ``gate.release()``;
    returns the gate, the streamer, its results stream and the held call."""
    gate = Gate()
    start_worker(broker, gate)
    streamer = make_streamer(broker, timeout=10)
    assert streamer.predict(["warm"]) == ["ok:warm"]
    [key] = broker.result_keys()
    held = streamer.submit(["hold"])
    assert gate.entered.wait(5)
    return gate, streamer, key, held


def assert_never_logged(caplog, secret: bytes = SECRET) -> None:
    for record in caplog.records:
        text = record.getMessage() + (record.exc_text or "")
        assert secret.decode() not in text, f"a payload reached the log: {text}"


def test_a_non_utf8_request_id_in_a_results_stream_does_not_stop_the_web_process(
    broker, make_streamer, start_worker, caplog
):
    """The defect this file started from: an entry with non-UTF-8 bytes in
    its ``i`` field made the result collector fail on it forever, and every
    later call of that web process timed out."""
    worker = start_worker(broker, double)
    streamer = make_streamer(broker, timeout=5)
    assert streamer.predict([1]) == [2]
    [key] = broker.result_keys()
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        entry_id = broker.conn.xadd(key, {"i": b"\xff\xfe", "ok": "1", "k": "msgpack", "p": SECRET}).decode()
        for x in range(20):
            assert streamer.predict([x], timeout=3) == [x * 2]
    [line] = malformed_logs(caplog)
    assert entry_id in line and key in line and "field 'i'" in line
    assert_never_logged(caplog)
    [copy] = dead_letters(broker)
    assert copy[b"key"] == key.encode() and copy[b"id"] == entry_id.encode()
    assert copy[b"f:i"] == b"\xff\xfe" and copy[b"f:p"] == SECRET
    assert wait_for(lambda: broker.xlen(key) == 0, 3), "the entry should be trimmed away with the answers read"
    assert worker.alive() and streamer._backend._collector.is_alive()


BAD_REQUESTS = {
    "no fields a request has": {"x": "1"},
    "no client": {"i": "ab", "t": 60_000, "k": "msgpack", "p": SECRET},
    "a client id that is not UTF-8": {"c": b"\xff", "i": "ab", "t": 60_000, "k": "msgpack", "p": SECRET},
    "a client id that would name another key": {"c": "x:requests", "i": "ab", "t": 60_000, "k": "msgpack", "p": SECRET},
    "an empty request id": {"c": "web", "i": "", "t": 60_000, "k": "msgpack", "p": SECRET},
    "a timeout that is not a number": {"c": "web", "i": "ab", "t": "soon", "k": "msgpack", "p": SECRET},
    "a timeout of zero": {"c": "web", "i": "ab", "t": 0, "k": "msgpack", "p": SECRET},
    "a codec name that is not a name": {"c": "web", "i": "ab", "t": 60_000, "k": b"\x00\xff", "p": SECRET},
    "no payload": {"c": "web", "i": "ab", "t": 60_000, "k": "msgpack"},
    "a version that is not a number": {"v": "one", "c": "web", "i": "ab", "t": 60_000, "k": "msgpack", "p": SECRET},
    "a buffer b1 without b0": {"c": "web", "i": "ab", "t": 60_000, "k": "msgpack", "p": SECRET, "b1": b"x"},
    "a cost that is not a number": {"c": "web", "i": "ab", "t": 60_000, "k": "msgpack", "p": SECRET, "w": "lots"},
    "a cost of zero": {"c": "web", "i": "ab", "t": 60_000, "k": "msgpack", "p": SECRET, "w": "0"},
}


@pytest.mark.parametrize("fields", list(BAD_REQUESTS.values()), ids=list(BAD_REQUESTS))
def test_a_malformed_request_goes_to_the_dead_letter_stream_and_the_worker_serves_on(
    broker, make_streamer, start_worker, caplog, fields
):
    seen: List[Any] = []
    worker = start_worker(broker, lambda batch: seen.extend(batch) or double(batch))
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        entry_id = broker.conn.xadd(broker.requests, fields).decode()
        assert make_streamer(broker).predict([21]) == [42]
        assert wait_for(lambda: len(dead_letters(broker)) == 1, 3)
    assert seen == [21], "only the real input reaches the model"
    [line] = malformed_logs(caplog)
    assert entry_id in line and broker.requests in line
    assert_never_logged(caplog)
    [copy] = dead_letters(broker)
    assert copy[b"key"] == broker.requests.encode() and copy[b"id"] == entry_id.encode() and copy[b"reason"]
    assert wait_for(lambda: broker.xlen() == 0 and broker.pending() == 0, 3), "acknowledged and deleted"
    assert worker.alive()


def test_an_answer_for_a_call_nobody_waits_for_is_dropped_and_cannot_complete_another_call(
    broker, make_streamer, start_worker, caplog
):
    """Request ids are random: answers forged with guessed ids (the numbers
    0.1.0 used, random ones) complete no call, and are dropped silently."""
    gate, streamer, key, held = a_call_held_in_the_model(broker, make_streamer, start_worker)
    waiting = streamer.submit(["queued"])
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        wrong = msgpack.packb("forged")
        for guess in [str(n) for n in range(200)] + ["deadbeefdeadbeef", "0000000000000000"]:
            broker.conn.xadd(key, {"v": 1, "i": guess, "ok": "1", "k": "msgpack", "p0": wrong})
        time.sleep(0.5)
        assert not held.done() and not waiting.done(), "a forged answer completed a call"
    gate.release()
    assert held.result(5) == ["ok:hold"] and waiting.result(5) == ["ok:queued"]
    assert malformed_logs(caplog) == [] and dead_letters(broker) == [], "well-formed answers are not malformed"


def test_request_ids_are_random(broker, make_streamer):
    streamer = make_streamer(broker, overload_after=None)  # every request sent, no worker to take them
    for start in (0, 100, 200):  # calls of 100: no worker counted, a larger one would wait in part (test_large_calls)
        streamer.submit(list(range(start, start + 100)))
    broker.wait_queued(300)
    ids = [fields[b"i"] for _, fields in broker.conn.xrange(broker.requests)]
    assert len(set(ids)) == 300
    assert all(re.fullmatch(rb"[0-9a-f]{16}", item_id) for item_id in ids)


def test_a_request_of_a_newer_version_is_answered_with_a_clear_error(broker, start_worker):
    seen: List[Any] = []
    start_worker(broker, lambda batch: seen.extend(batch) or batch)
    broker.conn.xadd(broker.requests, {"v": 99, "c": "future", "i": "ab", "t": 60_000, "k": "msgpack",
                                       "p": msgpack.packb(1)})  # fmt: skip
    assert wait_for(lambda: broker.xlen(broker.results("future")) == 1, 5)
    [(_, answer)] = broker.conn.xrange(broker.results("future"))
    assert answer[b"ok"] == b"0"
    error = msgpack.unpackb(answer[b"p0"])
    assert error["type"] == "SerializationError" and "newer version" in error["message"]
    assert seen == []


def test_an_answer_of_a_newer_version_fails_its_call_clearly(broker, make_streamer):
    streamer = make_streamer(broker)  # no worker: the test answers in its place
    future = streamer.submit([1])
    broker.wait_queued(1)
    [(_, request)] = broker.conn.xrange(broker.requests)
    broker.conn.xadd(broker.results(request[b"c"].decode()),
                     {"v": 99, "i": request[b"i"], "ok": "1", "k": "msgpack", "p0": msgpack.packb(2)})  # fmt: skip
    with pytest.raises(SerializationError, match="newer version"):
        future.result(5)


def test_a_web_process_of_0_1_0_is_answered_in_its_own_format(broker, start_worker):
    """A request without a version (as 0.1.0 wrote them, with a numbered id)
    is answered with one entry per answer, in the fields 0.1.0 reads."""
    start_worker(broker, double)
    broker.conn.xadd(broker.requests, {"c": "old", "i": "7", "t": 60_000, "k": "msgpack", "p": msgpack.packb(21)})
    assert wait_for(lambda: broker.xlen(broker.results("old")) == 1, 5)
    [(_, answer)] = broker.conn.xrange(broker.results("old"))
    assert answer == {b"i": b"7", b"ok": b"1", b"k": b"msgpack", b"p": msgpack.packb(42)}


def test_the_dead_letter_stream_is_capped_and_the_log_is_not_flooded(broker, make_streamer, start_worker, caplog):
    start_worker(broker, double, batch_size=64)
    big = SECRET + b"x" * 10_000
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        pipe = broker.conn.pipeline(transaction=False)
        for _ in range(1500):
            pipe.xadd(broker.requests, {"c": "web", "i": "ab", "t": "bad", "k": "msgpack", "p": big})
        pipe.execute()
        assert wait_for(lambda: broker.xlen() == 0, 20), "every malformed request should be dropped"
        assert make_streamer(broker).predict([1]) == [2]
    letters = dead_letters(broker)
    assert 900 <= len(letters) <= 1200, f"the dead-letter stream holds {len(letters)} entries"
    assert all(len(fields[b"f:p"]) == 256 for fields in letters)
    logged = malformed_logs(caplog)
    assert 1 <= len(logged) <= 20, f"{len(logged)} log lines for 1500 malformed entries"
    assert_never_logged(caplog)


def test_a_malformed_request_taken_over_from_a_dead_worker_is_dead_lettered(broker, make_streamer, start_worker):
    broker.conn.xgroup_create(broker.requests, GROUP, id="0", mkstream=True)
    broker.conn.xadd(broker.requests, {"c": b"\xff", "i": "ab"})
    # A worker that read it and died: it stays pending under that name.
    assert broker.conn.xreadgroup(GROUP, "dead-worker", {broker.requests: ">"}, count=1)
    assert broker.pending() == 1
    worker = start_worker(broker, double, claim_after=0.3)
    assert wait_for(lambda: broker.pending() == 0 and broker.xlen() == 0, 5)
    assert len(dead_letters(broker)) == 1
    assert make_streamer(broker).predict([4]) == [8] and worker.alive()


def test_a_consumer_with_a_name_that_is_not_utf8_does_not_stop_a_worker(broker, make_streamer, start_worker):
    broker.conn.xgroup_create(broker.requests, GROUP, id="0", mkstream=True)
    broker.conn.execute_command("XGROUP", "CREATECONSUMER", broker.requests, GROUP, b"\xff\xfe-odd")
    worker = start_worker(broker, double, claim_after=0.3)  # sweeps the consumers as it starts
    assert make_streamer(broker).predict([4]) == [8]
    time.sleep(0.5)
    assert worker.alive() and worker.error is None


def test_a_requests_stream_overwritten_with_another_type_is_repaired(broker, make_streamer, start_worker, caplog):
    worker = start_worker(broker, double)
    streamer = make_streamer(broker, timeout=5)
    assert streamer.predict([1]) == [2]
    with caplog.at_level(logging.ERROR, logger=LOGGER):
        broker.conn.set(broker.requests, "not a stream")
        assert wait_for(lambda: broker.conn.type(broker.requests) != b"string", 5)
        assert streamer.predict([2]) == [4]
    assert any("held a Redis string, not a stream" in r.getMessage() for r in caplog.records)
    assert worker.alive()


def test_a_results_stream_overwritten_with_another_type_is_repaired_and_its_calls_answered(
    broker, make_streamer, start_worker
):
    """The answer written while the stream held something else is lost with
    it: the web process repairs its stream and sends its unanswered requests
    again, so the call is still answered."""
    gate, streamer, key, held = a_call_held_in_the_model(broker, make_streamer, start_worker)
    broker.conn.delete(key)
    broker.conn.rpush(key, "not a stream")
    gate.release()
    assert held.result(8) == ["ok:hold"]
    assert broker.conn.type(key) == b"stream"
    assert streamer.predict(["after"]) == ["ok:after"]


def test_the_presence_set_overwritten_with_another_type_is_repaired(broker, make_streamer, start_worker):
    start_worker(broker, double)
    streamer = make_streamer(broker, require_workers=True)
    assert streamer.wait_ready(5)
    workers_key = f"streamer:{broker.prefix}:workers"
    broker.conn.set(workers_key, "not a sorted set")
    assert wait_for(lambda: broker.conn.type(workers_key) == b"zset", 5), "the next beat repairs it"
    assert streamer.live_workers() == 1
    assert streamer.predict([3]) == [6]


def test_presence_members_dated_in_the_future_are_not_counted(broker, make_streamer, start_worker):
    start_worker(broker, double)
    streamer = make_streamer(broker, require_workers=True)
    assert streamer.wait_ready(5)
    seconds, _ = broker.conn.time()
    broker.conn.zadd(f"streamer:{broker.prefix}:workers", {b"forged": (seconds + 3600) * 1000, b"inf": float("inf")})
    assert streamer.live_workers() == 1


# -- everything at once, at random -----------------------------------------------------------

#: Commands of each Redis type, to run against keys of another type: the arguments after the key.
WRONG_TYPE_ARGS = {
    "lpush": ["x"],
    "sadd": ["x"],
    "hset": ["f", "1"],
    "incr": [],
    "zadd": ["1", "m"],
    "xadd": ["*", "f", "1"],
}


def test_random_writes_to_every_key_never_stop_the_service_or_change_an_answer(broker, make_streamer, start_worker):
    """While callers make calls, write random entries (random field names,
    bytes, numbers and text, and near-valid entries with one field spoiled)
    into every key under the prefix, add random members to the presence set,
    and run commands of other Redis types against each key. Every call still
    returns its own right answer within its timeout, and neither the worker
    nor the web process stops."""
    hypothesis = pytest.importorskip("hypothesis")
    from hypothesis import strategies as st

    worker = start_worker(broker, double, batch_size=8, claim_after=0.5)
    streamer = make_streamer(broker, timeout=10)
    assert streamer.predict([0]) == [0]
    [results_key] = broker.result_keys()
    dead_key = f"streamer:{broker.prefix}:dead"
    workers_key = f"streamer:{broker.prefix}:workers"
    stream_keys = [broker.requests, results_key, dead_key]

    problems: List[str] = []
    answered = [0]
    stop = threading.Event()

    def caller(n: int) -> None:
        x = n * 1_000_000
        while not stop.is_set():
            x += 1
            try:
                answer = streamer.predict([x, -x], timeout=10)
            except Exception as exc:  # reported below: any failure is a finding
                problems.append(f"{x}: {exc!r}")
                continue
            if answer != [2 * x, -2 * x]:
                problems.append(f"{x}: answered {answer!r}")
            answered[0] += 1

    callers = [threading.Thread(target=caller, args=(n,), daemon=True) for n in range(4)]
    for thread in callers:
        thread.start()

    not_utf8 = st.sampled_from([b"\xff", b"\xfe\xff", b"\xc3\x28", b"\xed\xa0\x80", b"ok\x80"])
    names = st.one_of(
        st.sampled_from([b"v", b"c", b"i", b"t", b"k", b"p", b"ok", b"p0", b"b0", b"b0_0", b"p1"]),
        not_utf8,
        st.binary(min_size=1, max_size=12),
    )
    values = st.one_of(
        not_utf8,
        st.binary(max_size=64),
        st.integers(-(2**63), 2**63 - 1),
        st.floats(allow_nan=False),
        st.text(max_size=24),
        st.sampled_from([b"", b"0", b"1", b"2", b"msgpack", b"pickle", results_key.rsplit(":", 1)[1].encode()]),
    )
    valid_request = {b"v": b"1", b"c": b"someone", b"i": b"abcd", b"t": b"60000", b"k": b"msgpack",
                     b"p": msgpack.packb(1)}  # fmt: skip
    valid_answer = {b"v": b"1", b"i": b"abcd", b"ok": b"1", b"k": b"msgpack", b"p0": msgpack.packb(1)}
    old_answer = {b"i": b"7", b"ok": b"1", b"k": b"msgpack", b"p": msgpack.packb(1)}

    def spoil(entry: Dict[bytes, bytes]) -> Any:
        """The entry with one of its own fields given a random value, or a random field added."""
        return st.tuples(st.one_of(st.sampled_from(sorted(entry)), names), values).map(
            lambda change: {**entry, change[0]: change[1]}
        )

    random_entry = st.dictionaries(names, values, min_size=1, max_size=8)
    requests_entry = st.one_of(random_entry, spoil(valid_request))
    answers_entry = st.one_of(random_entry, spoil(valid_answer), spoil(old_answer))
    writes = st.one_of(
        st.tuples(st.just("xadd"), st.just(broker.requests), requests_entry),
        st.tuples(st.just("xadd"), st.just(results_key), answers_entry),
        st.tuples(st.just("xadd"), st.just(dead_key), random_entry),
        st.tuples(st.just("zadd"), st.just(workers_key), st.tuples(st.binary(max_size=16), st.floats(allow_nan=False))),
        st.tuples(
            st.just("wrongtype"),
            st.sampled_from(stream_keys + [workers_key]),
            st.sampled_from(sorted(WRONG_TYPE_ARGS)),
        ),  # fmt: skip
        st.tuples(st.just("other"), st.binary(min_size=1, max_size=8), values),
    )

    def apply(op: Any) -> None:
        kind, key, arg = op
        conn = broker.conn
        try:
            if kind == "xadd":
                conn.xadd(key, arg)
            elif kind == "zadd":
                conn.zadd(key, {arg[0]: arg[1]})
            elif kind == "wrongtype":
                conn.execute_command(arg.upper(), key, *WRONG_TYPE_ARGS[arg])
            else:
                conn.set(f"streamer:{broker.prefix}:".encode() + key, arg if not isinstance(arg, float) else repr(arg))
        except Exception:  # a command of the wrong type for the key: Redis refuses it, which is the point
            pass

    @hypothesis.settings(max_examples=80, deadline=None, database=None,
                         suppress_health_check=list(hypothesis.HealthCheck))  # fmt: skip
    @hypothesis.given(st.lists(writes, min_size=1, max_size=10))
    def inject(ops: List[Any]) -> None:
        for op in ops:
            apply(op)
        time.sleep(0.01)

    try:
        inject()
        time.sleep(1.0)  # calls made just after the last writes finish too
    finally:
        stop.set()
        for thread in callers:
            thread.join(15)
    assert not problems, f"{len(problems)} calls went wrong, e.g. {problems[:5]}"
    assert answered[0] > 50, "the callers should have kept getting answers throughout"
    assert worker.alive() and worker.error is None, f"the worker stopped: {worker.error!r}"
    assert streamer._backend._collector.is_alive() and streamer._backend._deleter.is_alive()
    assert streamer.predict([5]) == [10]
