"""Work for callers who are gone, over Redis: a request whose caller
cancelled it or whose deadline passed is not run by a worker, whether the
worker had read it (it waits there while the model is busy) or not; the
worker acknowledges and deletes it, so nothing is left pending, and the
requests of live callers around it are answered as usual."""

from __future__ import annotations

import time

import pytest

from streamer_core import StreamerTimeoutError
from tests.redis.conftest import wait_for


def test_a_request_cancelled_after_a_busy_worker_read_it_is_skipped_and_acknowledged(
    broker, make_streamer, start_worker, gate
):
    worker = start_worker(broker, gate, batch_size=4)
    streamer = make_streamer(broker, timeout=10)
    held = streamer.submit(["hold"])
    assert gate.entered.wait(5)
    cancelled = streamer.submit(["cancelled"])
    kept = streamer.submit(["kept"])
    assert wait_for(lambda: broker.pending() == 3, 5), "the worker should have read the requests ahead"
    assert cancelled.cancel()
    time.sleep(0.1)  # the web side withdraws it from Redis in a thread of its own
    gate.release()
    assert held.result(5) == ["ok:hold"] and kept.result(5) == ["ok:kept"]
    assert gate.seen() == ["hold", "kept"], "the worker ran a request its caller had cancelled"
    assert wait_for(lambda: broker.xlen() == 0 and broker.pending() == 0, 3), "the skipped request was left behind"
    assert worker.worker.stats().dropped == {"cancelled": 1, "expired": 0, "disconnected": 0}


def test_a_request_that_expired_in_a_busy_workers_hands_is_skipped_and_acknowledged(
    broker, make_streamer, start_worker, gate
):
    worker = start_worker(broker, gate, batch_size=4)
    streamer = make_streamer(broker, timeout=10)
    held = streamer.submit(["hold"])
    assert gate.entered.wait(5)
    expired = streamer.submit(["expired"], timeout=0.3)
    assert wait_for(lambda: broker.pending() == 2, 5), "the worker should have read the request ahead"
    assert isinstance(expired.exception(5), StreamerTimeoutError)
    time.sleep(0.1)
    gate.release()
    assert held.result(5) == ["ok:hold"]
    assert streamer.predict(["after"]) == ["ok:after"]
    assert gate.seen() == ["hold", "after"], "the worker ran a request past its deadline"
    assert wait_for(lambda: broker.xlen() == 0 and broker.pending() == 0, 3), "the skipped request was left behind"
    assert worker.worker.stats().dropped == {"cancelled": 0, "expired": 1, "disconnected": 0}


def test_a_request_cancelled_before_any_worker_read_it_never_runs(broker, make_streamer, start_worker, gate):
    streamer = make_streamer(broker, timeout=10)
    cancelled = streamer.submit(["cancelled"])
    broker.wait_queued(1)
    assert cancelled.cancel()
    assert wait_for(lambda: broker.xlen() == 0, 3), "a cancelled request was left in the stream"
    start_worker(broker, gate, batch_size=4)
    assert streamer.predict(["after"]) == ["ok:after"]
    assert gate.seen() == ["after"]


def test_a_worker_acknowledges_what_expired_in_its_hands_with_no_web_process_left_to(
    broker, make_streamer, start_worker, gate
):
    """A request whose web process is gone (nobody withdraws it) expires
    while a busy worker holds it: the worker itself drops it unrun,
    acknowledges and deletes it, nothing is left pending, and without
    waiting for another request to come."""
    from streamer_core.backends.redis.wire import new_request_id, request_fields
    from streamer_core.codec import get_codec

    worker = start_worker(broker, gate, batch_size=4)
    streamer = make_streamer(broker, timeout=10)
    held = streamer.submit(["hold"])
    assert gate.entered.wait(5)
    payload, buffers = get_codec("msgpack").dumps("orphaned")
    broker.conn.xadd(broker.requests, request_fields("gone-web-process", new_request_id(), 300, "msgpack", payload))
    assert wait_for(lambda: broker.pending() == 2, 5), "the worker should have read the request ahead"
    time.sleep(0.5)  # past its 300 ms
    gate.release()
    assert held.result(5) == ["ok:hold"]
    assert wait_for(lambda: worker.worker.stats().dropped["expired"] == 1, 5), worker.worker.stats().dropped
    assert wait_for(lambda: broker.xlen() == 0 and broker.pending() == 0, 3), "the expired request was left behind"
    assert gate.seen() == ["hold"]


def test_a_request_no_batch_could_answer_in_time_is_acknowledged_unrun(broker, make_streamer, start_worker):
    """Its batches take 0.3 s (learned from the three before): a request with
    0.2 s left is not run, as in-process, and counted expired by the worker."""
    ran: list = []

    def model(batch: list) -> list:
        ran.extend(batch)
        time.sleep(0.3)
        return [x * 2 for x in batch]

    worker = start_worker(broker, model, batch_size=4, name=f"worker-{broker.prefix}")
    streamer = make_streamer(broker)
    assert [streamer.predict([n]) for n in range(3)] == [[0], [2], [4]]
    with pytest.raises(StreamerTimeoutError):
        streamer.predict([7], timeout=0.2)
    assert wait_for(lambda: broker.xlen() == 0 and broker.pending() == 0, 3), "acknowledged and deleted, unrun"
    assert ran == [0, 1, 2] and worker.worker.stats().dropped["expired"] == 1
    assert streamer.predict([2], timeout=5) == [4]


def test_a_withdrawn_request_batched_with_a_fresh_one_never_runs(broker, make_streamer, start_worker):
    """The worker asks Redis which requests of a batch were withdrawn when any
    request of it has waited there a while: the oldest decides, not the
    newest. A request read ahead and then cancelled, batched with one read
    a moment before the batch runs, does not reach the model."""
    ran: list = []
    handle: list = []

    def model(batch: list) -> list:
        ran.extend(batch)
        if "hold" in batch:
            # Return as soon as the fresh request is read ahead, so the next
            # batch (the withdrawn one and the fresh one) runs at once.
            deadline = time.monotonic() + 20
            while handle[0].worker.gauges()[0] < 2 and time.monotonic() < deadline:
                time.sleep(0.0005)
        return [f"ok:{x}" for x in batch]

    handle.append(start_worker(broker, model, batch_size=2, max_latency=1.0))
    worker = handle[0]
    streamer = make_streamer(broker, timeout=10)
    held = streamer.submit(["hold"])
    assert wait_for(lambda: "hold" in ran, 5)
    withdrawn = streamer.submit(["withdrawn"])
    assert wait_for(lambda: worker.worker.gauges()[0] == 1, 5), "the busy worker should have read it ahead"
    time.sleep(0.05)  # it has waited in the worker's hands
    assert withdrawn.cancel()
    assert wait_for(lambda: broker.xlen() == 1, 3), "its entry deleted from the stream"
    fresh = streamer.submit(["fresh"])
    assert held.result(10) == ["ok:hold"] and fresh.result(10) == ["ok:fresh"]
    assert ran == ["hold", "fresh"], "the worker ran a request its caller had withdrawn"
    assert wait_for(lambda: worker.worker.stats().dropped["cancelled"] == 1, 3), worker.worker.stats().dropped


def test_a_request_that_expires_between_being_batched_and_running_is_not_run(fault_broker, start_worker):
    """A request whose deadline passes while it waits at the worker is
    dropped before it runs, even when it passed after its batch was formed:
    here the model's thread, holding a batch of one request, waits to hand
    the writer another, expired request while the writer retries answers
    Redis refuses (out of memory), and the batch's request expires
    meanwhile. It is counted expired and never reaches the model."""
    import threading

    from streamer_core.backends.redis.wire import new_request_id, request_fields
    from streamer_core.codec import get_codec

    first, second = "x" * 10, "y" * 10
    ran: list = []
    gates = {first: threading.Event(), second: threading.Event()}
    entered = {name: threading.Event() for name in gates}

    def model(batch: list) -> list:
        ran.extend(batch)
        for name in batch:
            if name in gates:
                entered[name].set()
                gates[name].wait(30)
        return list(batch)

    # Shaped by cost (an input's length, at most 10 a batch): each of the
    # first two requests is a batch of its own. claim_after is long, so the
    # worker takes none of its own requests over while its heartbeat is refused.
    worker = start_worker(fault_broker, model, batch_size=4, item_cost=len, max_batch_cost=10, claim_after=30).worker
    codec = get_codec("msgpack")
    workers_key = f"streamer:{fault_broker.prefix}:workers"
    assert wait_for(lambda: fault_broker.conn.zcard(workers_key) == 1, 10), "the worker never beat"

    def send(value: str, timeout_ms: int) -> float:
        """Send a request of a web process that is gone; when it expires, in seconds."""
        payload, _ = codec.dumps(value)
        fields = request_fields("gone-web-process", new_request_id(), timeout_ms, "msgpack", payload)
        entry_id = fault_broker.conn.xadd(fault_broker.requests, fields)
        return (int(entry_id.split(b"-")[0]) + timeout_ms) / 1000  # the server's clock is this machine's

    def until(when: float) -> None:
        time.sleep(max(0.0, when - time.time()))

    send(first, 30_000)
    assert entered[first].wait(10)
    send(second, 30_000)
    expired_at = send("e", 3_000)  # expires while the second batch runs
    late_at = send("c", 5_500)  # batched once the second batch has run, then expires
    assert wait_for(lambda: fault_broker.pending() == 4, 10), "the busy worker should have read all ahead"
    fault_broker.conn.config_set("maxmemory", 1)  # answers are refused (the writer retries); reads go on
    try:
        gates[first].set()  # its answers: the writer retries them
        assert entered[second].wait(10)
        until(expired_at + 0.3)
        gates[second].set()  # its answers wait for the writer; "e" expired, "c" is batched
        until(late_at + 0.3)
    finally:
        fault_broker.conn.config_set("maxmemory", 0)
        for gate in gates.values():
            gate.set()
    assert wait_for(lambda: fault_broker.xlen() == 0 and fault_broker.pending() == 0, 10), "left behind"
    assert ran == [first, second], "the worker ran a request past its deadline"
    assert wait_for(lambda: worker.stats().dropped["expired"] == 2, 5), worker.stats().dropped
