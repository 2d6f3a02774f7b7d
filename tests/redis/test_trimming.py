"""Nothing piles up in Redis: requests whose caller gave up never reach the
model, answered requests leave the stream, result streams are trimmed and
expire, and memory stays flat over thousands of calls."""

from __future__ import annotations

import asyncio
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

import msgpack
import pytest

from streamer_core import StreamerTimeoutError
from streamer_core.backends.redis.client import BATCHES_PER_WORKER
from tests.redis import models
from tests.redis.conftest import wait_for


def test_requests_whose_caller_gave_up_never_reach_the_model(broker, make_streamer, start_worker):
    streamer = make_streamer(broker)
    for i in range(5):
        with pytest.raises(StreamerTimeoutError):
            streamer.predict([f"late{i}"], timeout=0.05)
    waiting = streamer.submit(["in time"], timeout=10)
    broker.wait_queued(1)
    seen = []
    start_worker(broker, lambda batch: seen.extend(batch) or batch, batch_size=8)
    assert waiting.result(10) == ["in time"]
    assert seen == ["in time"], "a request whose caller had given up reached the model"
    assert wait_for(lambda: broker.xlen() == 0 and broker.pending() == 0, 3), "skipped requests must be deleted"


def test_a_worker_skips_requests_past_their_deadline(broker, start_worker):
    """Whatever the web side does (it may have died): a request older than
    its timeout ('t', in ms) is dropped by the worker unrun."""
    client = uuid.uuid4().hex
    for i in range(3):
        broker.conn.xadd(broker.requests, {"c": client, "i": f"old{i}", "t": 50, "k": "msgpack", "p": msgpack.packb(i)})
    broker.conn.xadd(broker.requests, {"c": client, "i": "new", "t": 60_000, "k": "msgpack", "p": msgpack.packb(7)})
    time.sleep(0.2)  # the first three are past their deadline now
    seen = []
    worker = start_worker(broker, lambda batch: seen.extend(batch) or [x * 2 for x in batch], batch_size=8)
    assert wait_for(lambda: broker.conn.exists(broker.results(client)), 5)
    [(_, answer)] = broker.conn.xrange(broker.results(client))
    assert answer[b"i"] == b"new" and msgpack.unpackb(answer[b"p"]) == 14
    assert seen == [7]
    assert wait_for(lambda: broker.xlen() == 0 and broker.pending() == 0, 3), "expired requests must be deleted"
    assert worker.worker.stats().dropped["expired"] == 3


def test_a_call_that_times_out_while_the_worker_is_busy_is_skipped(broker, make_streamer, start_worker, gate):
    start_worker(broker, gate, batch_size=4)
    streamer = make_streamer(broker)
    held = streamer.submit(["hold"])
    assert gate.entered.wait(5)
    with pytest.raises(StreamerTimeoutError):
        streamer.predict(["too late"], timeout=0.2)
    gate.release()
    assert held.result(5) == ["ok:hold"]
    assert streamer.predict(["after"]) == ["ok:after"]
    assert gate.seen() == ["hold", "after"]


def test_streams_and_memory_stay_bounded_over_thousands_of_calls(fault_broker, make_streamer, start_worker):
    """On a server of its own, so used_memory is this test's alone."""
    start_worker(fault_broker, models.double, batch_size=32, max_latency=0.002)
    streamer = make_streamer(fault_broker, timeout=20)
    info = fault_broker.conn.info

    def run(calls: int) -> list:
        samples = []
        with ThreadPoolExecutor(16) as pool:
            for start in range(0, calls, 500):
                chunk = range(start, start + 500)
                assert list(pool.map(lambda x: streamer.predict([x]), chunk)) == [[x * 2] for x in chunk]
                samples.append((fault_broker.xlen(), [fault_broker.xlen(k) for k in fault_broker.result_keys()]))
        return samples

    run(500)  # warm up: streams, group, connections
    time.sleep(0.1)
    before = info("memory")["used_memory"]
    samples = run(3000)
    time.sleep(0.1)
    after = info("memory")["used_memory"]
    assert all(requests <= 64 for requests, _ in samples), f"the request stream grew: {samples}"
    # Read answers are trimmed away, a whole stream node (100 entries) at a time.
    assert all(len(results) == 1 and results[0] <= 250 for _, results in samples), (
        f"the result stream should be trimmed as it is read: {samples}"
    )
    assert wait_for(lambda: fault_broker.xlen() == 0 and fault_broker.pending() == 0, 3)
    assert after - before < 250_000, f"Redis memory grew by {after - before} bytes over 3000 calls"
    # The request stream, this web process's result stream, and the set of
    # live workers and their info (one member each, which leaves on exit):
    # nothing per call.
    kinds = sorted(key.split(":")[2] for key in fault_broker.keys())
    assert kinds == ["requests", "results", "worker-info", "workers"], fault_broker.keys()
    assert fault_broker.conn.zcard(f"streamer:{fault_broker.prefix}:workers") == 1
    assert fault_broker.conn.hlen(f"streamer:{fault_broker.prefix}:worker-info") == 1


def test_the_result_stream_of_a_web_process_that_went_away_expires(broker, start_worker):
    """A web process that dies without close() leaves a result stream that
    Redis deletes by itself."""
    start_worker(broker, models.double, batch_size=4)
    gone = uuid.uuid4().hex
    broker.conn.xadd(broker.requests, {"c": gone, "i": "0", "t": 60_000, "k": "msgpack", "p": msgpack.packb(4)})
    key = broker.results(gone)
    assert wait_for(lambda: broker.conn.exists(key), 5)
    [(_, answer)] = broker.conn.xrange(key)
    assert answer[b"ok"] == b"1" and msgpack.unpackb(answer[b"p"]) == 8
    assert 0 < broker.conn.ttl(key) <= 300, "a result stream must expire when nobody reads it"


def test_a_live_web_process_keeps_its_result_stream_from_expiring(broker, make_streamer, start_worker):
    start_worker(broker, models.double, batch_size=4)
    streamer = make_streamer(broker)
    assert streamer.predict([1]) == [2]
    [key] = broker.result_keys()
    broker.conn.expire(key, 2)
    time.sleep(1.3)  # the web side renews the expiry about once a second
    assert broker.conn.ttl(key) > 2, "an idle but live web process let its result stream expire"


@pytest.mark.parametrize("give_up", ["result_timeout", "result_timeout_300_inputs", "apredict_cancelled"])
def test_a_call_its_caller_gave_up_on_does_not_reach_the_model(broker, make_streamer, start_worker, gate, give_up):
    """A caller gives up long before the streamer's timeout, while the worker
    is busy (``future.result(timeout)`` runs out, or an ``apredict`` task is
    cancelled, as when an HTTP client disconnects): its request is withdrawn
    from Redis and never reaches the model. (Once, it stayed and was run.)
    Of a call of 300 inputs, what is in Redis (two of the worker's batches:
    test_large_calls) is withdrawn, and the rest is never sent."""
    start_worker(broker, gate, batch_size=4)
    streamer = make_streamer(broker, timeout=10)
    held = streamer.submit(["hold"])
    assert gate.entered.wait(5)
    if give_up.startswith("result_timeout"):
        inputs = ["abandoned"] * (300 if give_up.endswith("300_inputs") else 1)
        future = streamer.submit(inputs)
        broker.wait_queued(min(1 + len(inputs), BATCHES_PER_WORKER * 4))  # the held one is out too
        with pytest.raises(StreamerTimeoutError):
            future.result(timeout=0.3)
        assert future.cancelled()
    else:

        async def client_disconnects() -> None:
            task = asyncio.ensure_future(streamer.apredict(["abandoned"]))
            await asyncio.sleep(0.1)
            broker.wait_queued(2)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task

        asyncio.run(client_disconnects())
    withdrawn = wait_for(lambda: broker.xlen() == 1, 3)  # only the held request is left
    gate.release()
    assert held.result(5) == ["ok:hold"]
    assert streamer.predict(["after"]) == ["ok:after"]
    assert gate.seen() == ["hold", "after"], "the model ran a call its caller had given up on"
    assert withdrawn, "the given-up request should have been withdrawn from Redis"
