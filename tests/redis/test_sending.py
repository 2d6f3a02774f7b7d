"""How a web process sends requests: a call's inputs in one command, the
callers it has just answered together once they are back, and never a
request held for callers who do not come back."""

from __future__ import annotations

import logging
import string
import threading
import time
from typing import Any, Dict, List

from hypothesis import given, settings
from hypothesis import strategies as st

from streamer_core.backends.redis.wire import (
    ADD_PACKED_REQUESTS_SCRIPT,
    packed_request_arguments,
    parse_request,
    request_fields,
    result_entry,
)
from streamer_core.batching import hold
from streamer_core.codec import get_codec
from tests.redis.conftest import Broker


def _calls(broker: Broker, command: str) -> int:
    """How many times the (private) server has run ``command`` so far."""
    stats: Dict[str, Any] = broker.conn.info("commandstats")
    return int(stats.get(f"cmdstat_{command}", {}).get("calls", 0))


def test_a_calls_inputs_are_sent_in_one_command(fault_broker, make_streamer, start_worker):
    start_worker(fault_broker, lambda batch: [x + 1 for x in batch], batch_size=64)
    streamer = make_streamer(fault_broker)
    assert streamer.predict([0]) == [1]
    scripts, adds = _calls(fault_broker, "evalsha"), _calls(fault_broker, "xadd")
    assert streamer.predict(list(range(40))) == list(range(1, 41))
    assert _calls(fault_broker, "evalsha") - scripts == 1
    # Each input is still an entry of its own (the worker's answer is one more).
    assert _calls(fault_broker, "xadd") - adds == 41


def test_callers_coming_back_are_sent_together(fault_broker, make_streamer, start_worker, monkeypatch):
    """16 callers in a closed loop: once answered, they come back one after
    another; their next requests go in about one command a round, not one
    each, nor one for each few that happen to be queued. (The gaps between
    callers that count as still coming back are stretched here, so that a
    loaded machine's scheduling of the 16 threads cannot split a round.)"""
    monkeypatch.setattr(hold, "STILL_ARRIVING", 0.005)
    start_worker(fault_broker, lambda batch: [x * 2 for x in batch], batch_size=16, max_latency=0.1)
    streamer = make_streamer(fault_broker)
    assert streamer.predict([1]) == [2]
    rounds, clients, wrong = 20, 16, []
    before = _calls(fault_broker, "evalsha")

    def client(index: int) -> None:
        for n in range(rounds):
            value = index * 1000 + n
            if streamer.predict([value]) != [2 * value]:
                wrong.append(value)

    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not wrong and not any(thread.is_alive() for thread in threads)
    sends = _calls(fault_broker, "evalsha") - before
    # Measured here: about 2 sends a round (40 for 20 rounds); 70 when the
    # web side sends as soon as anything is queued, and 320 one by one.
    assert sends <= 3 * rounds, f"{sends} sends for {rounds} rounds of {clients} calls"


def test_a_request_is_not_held_for_callers_who_do_not_come_back(broker, make_streamer, start_worker):
    """Eight callers are answered and leave; the next call is sent at once
    (the web side waits for answered callers at most 10 ms) and runs."""
    arrived: List[float] = []

    def model(batch: List[Any]) -> List[Any]:
        arrived.append(time.monotonic())
        return batch

    start_worker(broker, model, batch_size=8, max_latency=0.01)
    streamer = make_streamer(broker)
    assert streamer.predict(list(range(8))) == list(range(8))
    submitted = time.monotonic()
    assert streamer.predict(["next"]) == ["next"]
    waited = arrived[-1] - submitted
    assert waited < 0.25, f"the call reached the model {waited:.3f}s after it was made"


_TOKENS = st.text(alphabet=string.ascii_letters + string.digits + "-_", min_size=1, max_size=64)


def test_the_packed_script_writes_the_entries_request_fields_describes(broker):
    """Requests without buffers go in one script call whose arguments are
    packed (ADD_PACKED_REQUESTS_SCRIPT); what Redis holds then is, field for
    field and in order, the entry request_fields makes, which every worker
    reads. Random ids, timeouts, payloads of any bytes, with and without a
    cost, with and without a traceparent (a web side that traces)."""
    conn = broker.conn
    script = conn.register_script(ADD_PACKED_REQUESTS_SCRIPT)
    packed_key, plain_key = broker.requests, f"streamer:{broker.prefix}:plain"

    @settings(max_examples=60, deadline=None, database=None)
    @given(
        client=_TOKENS,
        codec=st.sampled_from(["msgpack", "pickle", "raw"]),
        requests=st.lists(
            st.tuples(
                _TOKENS.map(str.encode),
                st.integers(1, 86_400_000),  # what parse_request admits
                st.binary(max_size=300) | st.just(bytes(range(256)) * 40),
                st.none() | st.floats(min_value=1e-9, max_value=1e12, allow_nan=False, allow_infinity=False),
                st.none() | st.just("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"),
            ),
            min_size=1,
            max_size=20,
        ),
    )
    def check(client: str, codec: str, requests: List[Any]) -> None:
        conn.delete(packed_key, plain_key)
        ids = script([packed_key], packed_request_arguments(client, codec, requests), conn)
        assert len(ids) == len(requests)
        for item_id, timeout_ms, payload, cost, trace in requests:
            conn.xadd(plain_key, request_fields(client, item_id, timeout_ms, codec, payload, (), cost, trace))
        written = conn.xrange(packed_key)
        assert [entry_id for entry_id, _ in written] == ids
        expected = [list(fields.items()) for _, fields in conn.xrange(plain_key)]
        assert [list(fields.items()) for _, fields in written] == expected
        for (entry_id, fields), (item_id, timeout_ms, payload, cost, trace) in zip(written, requests):
            request = parse_request(entry_id, fields)
            assert (request.item_id, request.timeout_ms, request.payload, request.cost, request.trace) == (
                item_id,
                timeout_ms,
                payload,
                None if cost is None else float(repr(float(cost))),
                None if trace is None else trace.encode(),
            )

    check()


def test_a_server_whose_lua_lacks_cmsgpack_is_sent_plain_arguments(broker, make_streamer, start_worker, caplog):
    """Redis builds of the last decade all have cmsgpack in their Lua; should
    one lack it, the script fails as it fails there (a global it does not
    know), and the web process sends its requests as plain arguments from
    then on, the call that met the error included."""
    start_worker(broker, lambda batch: [x + 1 for x in batch], batch_size=8)
    streamer = make_streamer(broker)
    assert streamer.predict([0]) == [1]
    backend = streamer._backend
    without = ADD_PACKED_REQUESTS_SCRIPT.replace("cmsgpack.unpack", "cmsgpack_absent.unpack")
    backend._sender._add_packed = backend._send_conn.register_script(without)
    with caplog.at_level(logging.INFO, logger="streamer_core.redis"):
        assert streamer.predict([1, 2, 3]) == [2, 3, 4]
        assert streamer.predict([4]) == [5]
    assert backend._sender._packed is False
    said = [record.getMessage() for record in caplog.records]
    assert said.count("this Redis server's Lua has no cmsgpack: requests go in plain arguments") == 1


def _answer_as_two_workers_at_once(broker: Broker, first: List[Any], second: List[Any]) -> None:
    """Answer the queued requests whose inputs are in ``first`` and those in
    ``second`` as two workers that finish together would: one result entry
    each (input + 100), both written in one transaction, so that the web
    process reads them in one go."""
    codec = get_codec("msgpack")
    requests = [parse_request(entry_id, fields) for entry_id, fields in broker.conn.xrange(broker.requests)]
    by_input = {codec.loads(request.payload): request for request in requests}
    pipe = broker.conn.pipeline(transaction=True)
    for inputs in (first, second):
        answers = [(by_input[x].item_id, True, codec.dumps(x + 100)[0], ()) for x in inputs]
        pipe.xadd(broker.results(by_input[inputs[0]].client), result_entry(answers, "msgpack"))
    pipe.execute()


def test_a_second_batch_answered_at_once_waits_for_the_first_ones_callers(broker, make_streamer, monkeypatch):
    """Two workers that finish together: their answers reach the web process
    together. Their callers, woken together, would come back together, be
    sent together, and the two workers would start together, and finish
    together again, every time (two Redis workers: 1.64x-1.68x one; 1.72x-1.77x
    with this). So the second batch's callers are woken once the first's are
    back. (The pauses this allows are stretched here, so that a loaded
    machine's scheduling cannot decide the order.)"""
    from streamer_core.backends.redis import collector

    monkeypatch.setattr(collector, "_STAGGER_S", 5.0)
    monkeypatch.setattr(hold, "STILL_ARRIVING", 2.0)
    # And the sender's patience with them: once it gives up waiting for the
    # callers still due (a few ms here), it counts none due, and the second
    # batch's callers are woken then (4 ms early, beside eight busy loops).
    monkeypatch.setattr(hold, "_MIN_PATIENCE", 2.0)
    streamer = make_streamer(broker)
    woken: Dict[int, float] = {}
    back: Dict[int, float] = {}
    results: Dict[int, Any] = {}
    next_calls = []

    def caller(x: int) -> None:
        results[x] = streamer.predict([x])
        woken[x] = time.monotonic()
        if x < 4:  # the first batch's callers come back at once with their next call
            back[x] = time.monotonic()  # before: the web process counts it back inside submit()
            next_calls.append(streamer.submit([x + 1000]))

    threads = [threading.Thread(target=caller, args=(x,)) for x in range(8)]
    for thread in threads:
        thread.start()
    broker.wait_queued(8)
    _answer_as_two_workers_at_once(broker, [0, 1, 2, 3], [4, 5, 6, 7])
    for thread in threads:
        thread.join(10)
    assert results == {x: [x + 100] for x in range(8)}
    assert min(woken[x] for x in range(4, 8)) >= max(back.values())
    for future in next_calls:
        future.cancel()


def test_a_second_batch_is_not_held_for_callers_that_do_not_come_back(broker, make_streamer):
    """The same two batches, with callers that do not call again (a web
    request answered and gone): the second is answered within milliseconds
    of the first, not after a hold."""
    streamer = make_streamer(broker)
    done: Dict[int, float] = {}
    futures = {x: streamer.submit([x]) for x in range(8)}
    for x, future in futures.items():
        future.add_done_callback(lambda _, x=x: done.__setitem__(x, time.monotonic()))
    broker.wait_queued(8)
    _answer_as_two_workers_at_once(broker, [0, 1, 2, 3], [4, 5, 6, 7])
    assert {x: future.result(10) for x, future in futures.items()} == {x: [x + 100] for x in range(8)}
    gap = max(done.values()) - min(done.values())
    assert gap < 0.1, f"the second batch was answered {gap * 1000:.0f} ms after the first"
