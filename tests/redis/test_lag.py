"""The Redis backend's lag as Prometheus scrapes it: requests delivered to a
worker and not yet acknowledged (asked of Redis at the scrape), requests
taken over from a worker that stopped answering, and entries moved to the
dead-letter stream, by the worker or by the web process that read them."""

from __future__ import annotations

import time
from typing import Any, Callable, Dict, Tuple

import pytest

from streamer_core.telemetry.metrics import exposition
from streamer_core.telemetry.stats import stats_for
from tests.conftest import Gate
from tests.helpers import metric_samples
from tests.redis.conftest import GROUP, Broker, ThreadWorker, wait_for

pytest.importorskip("prometheus_client")

Samples = Dict[Tuple[str, Tuple[Tuple[str, str], ...]], float]


def scrape() -> Samples:
    body, _ = exposition()
    return metric_samples(body.decode())


def sample(name: str, model: str) -> Any:
    return scrape().get((name, (("model", model),)))


def double(batch: Any) -> Any:
    return [x * 2 for x in batch]


def test_pending_requests_are_asked_of_redis_at_each_scrape(
    broker: Broker, make_streamer: Callable[..., Any], start_worker: Callable[..., ThreadWorker]
) -> None:
    web = f"web-{broker.prefix}"
    streamer = make_streamer(broker, name=web, timeout=10)
    assert sample("streamer_redis_pending", web) == 0, "no worker yet: no group, nothing pending"
    gate = Gate()
    start_worker(broker, gate, name=f"worker-{broker.prefix}")
    assert streamer.predict(["warm"]) == ["ok:warm"]
    held = streamer.submit(["hold"])
    assert gate.entered.wait(5)
    assert sample("streamer_redis_pending", web) == 1, "the held request is the worker's, unacknowledged"
    gate.release()
    assert held.result(5) == ["ok:hold"]
    assert wait_for(lambda: sample("streamer_redis_pending", web) == 0, 5)


def test_pending_has_no_sample_while_redis_does_not_answer(
    fault_broker: Broker, make_streamer: Callable[..., Any]
) -> None:
    web = f"web-{fault_broker.prefix}"
    make_streamer(fault_broker, name=web)
    assert sample("streamer_redis_pending", web) == 0
    assert fault_broker.server is not None
    fault_broker.server.kill()
    started = time.monotonic()
    samples = scrape()  # does not raise
    assert ("streamer_redis_pending", (("model", web),)) not in samples
    assert samples[("streamer_requests_total", (("model", web), ("outcome", "ok")))] == 0
    assert time.monotonic() - started < 10


def test_requests_taken_over_from_a_dead_worker_count_as_redelivered(
    broker: Broker, make_streamer: Callable[..., Any], start_worker: Callable[..., ThreadWorker]
) -> None:
    streamer = make_streamer(broker, name=f"web-{broker.prefix}", timeout=10)
    broker.conn.xgroup_create(broker.requests, GROUP, id="0", mkstream=True)
    calls = [streamer.submit([n]) for n in range(3)]
    broker.wait_queued(3)
    # A worker that read them and died: they stay pending under its name.
    assert broker.conn.xreadgroup(GROUP, "dead-worker", {broker.requests: ">"}, count=10)
    worker = f"worker-{broker.prefix}"
    start_worker(broker, double, claim_after=0.3, name=worker)
    assert [call.result(10) for call in calls] == [[0], [2], [4]]
    assert stats_for(worker).snapshot().redelivered == 3
    assert sample("streamer_redis_redelivered_total", worker) == 3
    assert stats_for(worker).snapshot().dead_lettered == 0


def test_malformed_entries_count_as_dead_lettered_on_either_side(
    broker: Broker, make_streamer: Callable[..., Any], start_worker: Callable[..., ThreadWorker]
) -> None:
    worker, web = f"worker-{broker.prefix}", f"web-{broker.prefix}"
    start_worker(broker, double, name=worker)
    streamer = make_streamer(broker, name=web)
    broker.conn.xadd(broker.requests, {"c": b"\xff", "i": "ab"})  # a request that does not parse
    assert streamer.predict([21]) == [42]
    assert wait_for(lambda: sample("streamer_redis_dead_lettered_total", worker) == 1, 5)
    [results] = broker.result_keys()
    broker.conn.xadd(results, {"garbage": "1"})  # an answer that does not parse
    assert wait_for(lambda: sample("streamer_redis_dead_lettered_total", web) == 1, 5)
    assert streamer.predict([1]) == [2]
    assert stats_for(worker).snapshot().dead_lettered == 1 and stats_for(web).snapshot().dead_lettered == 1
    assert broker.conn.xlen(f"streamer:{broker.prefix}:dead") == 2


def test_a_worker_counts_itself_on_its_device_and_the_web_side_counts_what_redis_knows(
    broker: Broker,
    make_streamer: Callable[..., Any],
    start_worker: Callable[..., ThreadWorker],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The worker's own numbers count it on its device; the web process has
    no worker of its own and counts those Redis knows, by the device each
    wrote there, asked as its numbers are read (the scrape too)."""
    # A worker run in this process by an earlier test (run_forever(gpu_id=0)) leaves its device here.
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    worker, web = f"worker-{broker.prefix}", f"web-{broker.prefix}"
    handle = start_worker(broker, double, name=worker)
    streamer = make_streamer(broker, name=web)
    assert streamer.predict([1]) == [2]
    assert stats_for(worker).snapshot().workers_by_device == {"default": 1}
    seen = stats_for(web).snapshot()
    assert (seen.workers_live, seen.workers_by_device) == (1, {"default": 1})
    samples = scrape()
    assert samples[("streamer_workers_live", (("model", web),))] == 1
    assert samples[("streamer_workers_live_by_device", (("device", "default"), ("model", web)))] == 1
    handle.stop()
    assert stats_for(worker).snapshot().workers_by_device == {}
    # A worker that stops leaves Redis's set as it goes.
    assert wait_for(lambda: stats_for(web).snapshot().workers_by_device == {}, 5), stats_for(web).snapshot()
    assert stats_for(web).snapshot().workers_live == 0


def test_a_live_worker_whose_info_cannot_be_read_counts_on_device_unknown(
    broker: Broker, make_streamer: Callable[..., Any]
) -> None:
    """Anyone with access to Redis may write its presence keys: a worker
    that beats with no info, or info that does not parse, still counts, on
    ``unknown``, so that the devices add up to the live workers."""
    web = f"web-{broker.prefix}"
    make_streamer(broker, name=web)
    seconds, micros = broker.conn.time()
    now_ms = seconds * 1000 + micros // 1000
    broker.conn.zadd(f"streamer:{broker.prefix}:workers", {"no-info": now_ms, "garbled": now_ms, "numbered": now_ms})
    broker.conn.hset(f"streamer:{broker.prefix}:worker-info", "garbled", "{not json")
    broker.conn.hset(f"streamer:{broker.prefix}:worker-info", "numbered", '{"device": 3}')
    seen = stats_for(web).snapshot()
    assert (seen.workers_live, seen.workers_by_device) == (3, {"unknown": 3})


def test_live_workers_read_0_and_no_device_while_redis_does_not_answer(
    fault_broker: Broker, make_streamer: Callable[..., Any], start_worker: Callable[..., ThreadWorker]
) -> None:
    """With Redis away no worker can take a batch (calls fail with
    BrokerUnavailableError): the web side's live workers read 0, and its
    devices have no sample rather than a number nobody knows."""
    web = f"web-{fault_broker.prefix}"
    start_worker(fault_broker, double, name=f"worker-{fault_broker.prefix}")
    streamer = make_streamer(fault_broker, name=web)
    assert streamer.predict([1]) == [2]
    assert sample("streamer_workers_live", web) == 1
    assert fault_broker.server is not None
    fault_broker.server.kill()
    samples = scrape()  # does not raise
    assert samples[("streamer_workers_live", (("model", web),))] == 0
    assert not [key for key in samples if key[0] == "streamer_workers_live_by_device" and ("model", web) in key[1]]
    seen = stats_for(web).snapshot()
    assert (seen.workers_live, seen.workers_by_device) == (0, {})
