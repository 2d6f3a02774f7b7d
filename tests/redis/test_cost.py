"""Batches shaped by cost through Redis: the web side computes each input's
cost (``item_cost``) and sends it with the request (field ``w``); each
worker shapes its batches out of what it has read, within
``max_batch_cost``, and learns a cap when the model runs out of memory."""

from __future__ import annotations

import math
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, List

import pytest

from streamer_core import ItemCostError
from streamer_core.backends.redis.wire import MalformedEntry, parse_request, request_fields
from tests.core.models import FakeOutOfMemory
from tests.redis import models
from tests.redis.conftest import GROUP


def run_load(streamer: Any, inputs: List[Any], threads: int = 24) -> List[Any]:
    with ThreadPoolExecutor(threads) as pool:
        return list(pool.map(lambda x: streamer.predict([x])[0], inputs))


def fields_as_read(fields: dict) -> dict:
    """Fields as Redis hands them back: names and values as bytes."""
    return {k.encode(): v if isinstance(v, bytes) else str(v).encode() for k, v in fields.items()}


def test_a_cost_travels_in_the_request_and_is_read_back():
    fields = request_fields("web", b"ab", 1000, "msgpack", b"p", cost=17)
    assert parse_request(b"1-0", fields_as_read(fields)).cost == 17.0
    assert parse_request(b"1-0", fields_as_read(request_fields("web", b"ab", 1000, "msgpack", b"p"))).cost is None


@pytest.mark.parametrize("value", [b"lots", b"0", b"-3", b"nan", b"inf", b"1" * 40, b"\xff"])
def test_a_cost_that_is_not_a_positive_number_makes_the_entry_malformed(value):
    fields = fields_as_read(request_fields("web", b"ab", 1000, "msgpack", b"p"))
    fields[b"w"] = value
    with pytest.raises(MalformedEntry, match="field 'w'"):
        parse_request(b"1-0", fields)


def test_the_worker_keeps_each_batch_within_the_budget(broker, make_streamer, start_worker):
    start_worker(broker, models.with_batch, batch_size=8, max_latency=0.02, max_batch_cost=12, batch_cost="sum")
    streamer = make_streamer(broker, item_cost=len)
    texts = ["x" * (1 + (5 * i) % 6) for i in range(200)] + ["y" * 50]
    answers = run_load(streamer, texts)
    assert [x for x, _ in answers] == texts
    batches = [batch for _, batch in answers]
    for batch in batches:
        assert len(batch) <= 8 and (len(batch) == 1 or sum(map(len, batch)) <= 12), f"over the budget: {batch}"
    assert ["y" * 50] in batches, "the input over the budget should run, alone"
    assert max(map(len, batches)) > 1, "nothing was ever batched"


def test_the_only_worker_shapes_out_of_two_full_batches_worth(broker, make_streamer, start_worker):
    """Shaped batches are usually far smaller than ``batch_size``; the only
    worker alive holds, besides the batch it runs, what two full batches
    would be less that batch (more to shape from), and never more: all of
    it pending under its name. Here each batch is one input (the budget),
    so a worker that held only one batch more would hold 1 + 4."""
    import redis

    streamer = make_streamer(broker, item_cost=len)
    texts = [f"{i:010d}" for i in range(40)]  # each costs 10: one per batch
    futures = [streamer.submit([text]) for text in texts]
    broker.wait_queued(40)
    looker = redis.Redis.from_url(broker.url)
    held = []

    def model(batch: list) -> list:
        time.sleep(0.03)  # the reader reads ahead, the writer acknowledges the last batch
        held.append((len(batch), int(looker.xpending(broker.requests, GROUP)["pending"])))
        return batch

    try:
        start_worker(broker, model, batch_size=4, max_latency=0.05, max_batch_cost=10)
        assert [f.result(10) for f in futures] == [[text] for text in texts]
    finally:
        looker.close()
    assert {size for size, _ in held} == {1}, held
    assert all(pending <= 8 for _, pending in held), f"(batch, pending) while running: {held}"
    assert any(pending == 8 for _, pending in held[:-8]), f"it should hold two full batches' worth: {held}"
    assert broker.pending() == 0 and broker.xlen() == 0


def test_a_worker_costs_requests_that_came_without_a_cost(broker, make_streamer, start_worker):
    start_worker(broker, models.with_batch, batch_size=8, max_latency=0.02, max_batch_cost=10, item_cost=len)
    streamer = make_streamer(broker)  # no item_cost on the web side
    texts = ["x" * (1 + i % 4) for i in range(120)]
    answers = run_load(streamer, texts)
    assert [x for x, _ in answers] == texts
    for _, batch in answers:  # batch_cost "max": length times the longest
        assert len(batch) == 1 or len(batch) * max(map(len, batch)) <= 10, f"over the budget: {batch}"


def test_an_input_that_cannot_be_costed_is_refused_before_it_is_sent(broker, make_streamer):
    streamer = make_streamer(broker, item_cost=len)
    with pytest.raises(ItemCostError, match="item_cost len raised TypeError for input 1"):
        streamer.predict(["fine", 3])
    assert broker.xlen() == 0, "a refused call reached Redis"


class MemoryBound:
    """Runs out of memory on a batch whose inputs add up to more than
    ``limit``, which the worker is not told; counts the times it did."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.ran_out = 0
        self.calls = 0
        self.lock = threading.Lock()

    def __call__(self, batch: List[int]) -> List[int]:
        with self.lock:
            self.calls += 1
            if sum(batch) > self.limit:
                self.ran_out += 1
                raise FakeOutOfMemory(f"{sum(batch)} does not fit in {self.limit}")
        return [x * 2 for x in batch]


def test_a_worker_splits_a_batch_that_runs_out_of_memory_and_learns_a_cap(broker, make_streamer, start_worker):
    model = MemoryBound(limit=30)
    worker = start_worker(
        broker,
        model,
        batch_size=16,
        max_latency=0.02,
        isolate_errors=False,
        batch_cost="sum",
        oom_errors=(FakeOutOfMemory,),
    )
    streamer = make_streamer(broker, item_cost=float)
    inputs = [1 + (7 * i) % 10 for i in range(600)]
    assert run_load(streamer, inputs, threads=32) == [x * 2 for x in inputs], "a caller saw the error"
    assert model.ran_out >= 1, "the model never ran out: the test proves nothing"
    assert worker.worker.cost_cap() <= 30 * 1.25**2
    assert not math.isinf(worker.worker.cost_cap())
    # The worker's own stats (its metrics) count the splits and show the cap.
    stats = worker.worker.stats()
    assert stats.oom_splits == model.ran_out
    assert stats.batch_cost_cap == worker.worker.cost_cap()
    assert model.ran_out < model.calls / 4, f"{model.ran_out} of {model.calls} model calls ran out of memory"


def test_the_worker_command_takes_the_budget(broker, make_streamer, procs):
    cli = procs.cli(
        broker,
        "tests.redis.models:with_batch",
        "--batch-size",
        "8",
        "--max-latency",
        "0.02",
        "--max-batch-cost",
        "12",
        "--batch-cost",
        "sum",
    )
    streamer = make_streamer(broker, item_cost=len, timeout=30)
    assert streamer.wait_ready(30), procs.log(cli)
    texts = ["x" * (1 + i % 6) for i in range(80)]
    answers = run_load(streamer, texts)
    assert [x for x, _ in answers] == texts
    for _, batch in answers:
        assert len(batch) == 1 or sum(map(len, batch)) <= 12, f"over the budget: {batch}"
