"""Batches shaped by cost: ``item_cost``, ``max_batch_cost`` and
``batch_cost``. A batch starts with the oldest waiting input and fills with
the waiting inputs closest to it in cost, within the budget; an input over
the budget by itself runs alone; an input whose cost cannot be had fails its
own call only."""

from __future__ import annotations

import math
import threading
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Deque, Dict, List

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streamer_core import BatchingConfig, ItemCostError, Streamer, ThreadedStreamer
from streamer_core.batching.former import SHAPED_TURN
from streamer_core.batching.scheduler import Scheduler
from streamer_core.batching.shaping import batch_cost
from tests.conftest import Gate
from tests.core import models


class Recorder:
    """A model that records its batches and answers each input with its length."""

    def __init__(self, gate: Gate | None = None) -> None:
        self.batches: List[List[Any]] = []
        self.lock = threading.Lock()
        self.gate = gate

    def __call__(self, batch: List[Any]) -> List[Any]:
        with self.lock:
            self.batches.append(list(batch))
        if self.gate is not None and "hold" in batch:
            self.gate.entered.set()
            assert self.gate.open.wait(30)
        return [len(x) for x in batch]


def cost_of(batch: List[str], rule: str = "max") -> float:
    return batch_cost(rule, [float(len(x)) for x in batch])


# -- the batch former, driven directly --------------------------------------

calls = st.lists(st.lists(st.integers(1, 40), min_size=1, max_size=3), min_size=1, max_size=60)
large_calls = st.lists(st.lists(st.integers(1, 40), min_size=1, max_size=40), min_size=1, max_size=12)


@settings(max_examples=200, deadline=None, database=None)
@given(
    calls=st.one_of(calls, large_calls),
    batch_size=st.integers(1, 12),
    budget=st.one_of(st.none(), st.integers(1, 120)),
    rule=st.sampled_from(["max", "sum"]),
    grouped=st.booleans(),
)
def test_every_batch_holds_the_oldest_input_and_keeps_within_size_and_budget(calls, batch_size, budget, rule, grouped):
    """Whatever the costs: every input in exactly one batch, at most
    ``batch_size`` inputs, no batch over the budget unless it holds one
    input, and the input at the head of the line always in the next batch.
    The line is the inputs in arrival order, but for a call of more than
    two batches' worth (``SHAPED_TURN``): its first two batches' worth line up
    as it comes, the rest join the line's back as many as each batch held,
    the calls in turn."""
    config = BatchingConfig(
        batch_size,
        max_latency=0,
        item_cost=float if grouped else None,
        max_batch_cost=budget if grouped or budget is not None else 1_000_000,
        batch_cost=rule,
    )
    scheduler = Scheduler(config)
    scheduler.add_slot()
    line: List[int] = []  # input ids, in the order they go
    parked: Deque[Deque[int]] = deque()  # each large call's inputs not in line yet
    costs: Dict[int, int] = {}
    for call in calls:
        ids = list(range(len(costs), len(costs) + len(call)))
        costs.update(zip(ids, call))
        line.extend(ids[: batch_size * SHAPED_TURN])
        if ids[batch_size * SHAPED_TURN :]:
            parked.append(deque(ids[batch_size * SHAPED_TURN :]))
        scheduler.put(ids, 60.0, [float(c) for c in call])
    seen: List[int] = []
    while line:
        handout = scheduler.next_batch()
        assert handout is not None
        items, held = handout
        batch = [item.value for item in items]
        assert line[0] in batch, "the input at the head of the line was left behind"
        assert 1 <= len(batch) <= batch_size
        if len(batch) > 1 and config.max_batch_cost is not None:
            assert batch_cost(rule, [costs[i] for i in batch]) <= config.max_batch_cost
        seen.extend(batch)
        taken = set(batch)
        line = [i for i in line if i not in taken]
        joining = len(batch)
        while joining and parked:
            next_call = parked.popleft()
            while joining and next_call:
                line.append(next_call.popleft())
                joining -= 1
            if next_call:
                parked.append(next_call)
        scheduler.batch_done(len(batch), 0.001, held)
    assert sorted(seen) == list(range(len(costs))), "an input ran twice or never"


# -- the thread backend ------------------------------------------------------


def test_inputs_of_like_cost_run_together(closing, gate):
    """With ``item_cost`` and more waiting than one batch holds, a batch is
    the oldest input and those closest to it in cost, not the next in line."""
    model = Recorder(gate)
    streamer = closing(ThreadedStreamer(model, batch_size=4, max_latency=0.01, item_cost=len))
    busy = streamer.submit(["hold"])
    assert gate.entered.wait(5)
    texts = ["a" * n for n in (5, 100, 6, 101, 5, 99, 7, 100)]
    queued = streamer.submit(texts)  # one call: all eight are waiting when the next batch is formed
    gate.release()
    assert busy.result(5) == [4]
    assert queued.result(5) == [len(t) for t in texts], "answers came back out of their callers' order"
    shaped = [sorted(len(x) for x in batch) for batch in model.batches[1:]]
    assert shaped == [[5, 5, 6, 7], [99, 100, 100, 101]]


def test_without_item_cost_batches_are_first_in_first_out(closing, gate):
    model = Recorder(gate)
    streamer = closing(ThreadedStreamer(model, batch_size=4, max_latency=0.01))
    streamer.submit(["hold"])
    assert gate.entered.wait(5)
    texts = ["a" * n for n in (5, 100, 6, 101, 5, 99, 7, 100)]
    queued = streamer.submit(texts)
    gate.release()
    queued.result(5)
    assert [[len(x) for x in batch] for batch in model.batches[1:]] == [[5, 100, 6, 101], [5, 99, 7, 100]]


@pytest.mark.parametrize("rule", ["max", "sum"])
def test_no_batch_goes_over_the_budget_and_a_costly_input_runs_alone(closing, rule):
    model = Recorder()
    streamer = closing(
        ThreadedStreamer(model, batch_size=8, max_latency=0.02, item_cost=len, max_batch_cost=24, batch_cost=rule)
    )
    texts = ["x" * (1 + (7 * i) % 9) for i in range(300)] + ["y" * 50]
    with ThreadPoolExecutor(32) as pool:
        answers = list(pool.map(lambda t: streamer.predict([t])[0], texts))
    assert answers == [len(t) for t in texts]
    assert sum(len(batch) for batch in model.batches) == len(texts)
    for batch in model.batches:
        assert len(batch) <= 8
        assert len(batch) == 1 or cost_of(batch, rule) <= 24, f"over the budget: {[len(x) for x in batch]}"
    assert ["y" * 50] in model.batches, "the input over the budget should run, alone"
    assert max(len(batch) for batch in model.batches) > 1, "nothing was ever batched"


def test_a_budget_without_item_cost_caps_the_count(closing, gate):
    model = Recorder(gate)
    streamer = closing(ThreadedStreamer(model, batch_size=8, max_latency=0.01, max_batch_cost=3, batch_cost="sum"))
    streamer.submit(["hold"])
    assert gate.entered.wait(5)
    queued = streamer.submit([str(i) for i in range(7)])
    gate.release()
    queued.result(5)
    assert [len(batch) for batch in model.batches[1:]] == [3, 3, 1]


# -- inputs whose cost cannot be had ------------------------------------------


def picky_cost(text: str) -> Any:
    if text == "boom":
        raise RuntimeError("cannot tokenize")
    return {"none": None, "zero": 0, "nan": math.nan, "neg": -2, "word": "ten", "flag": True}.get(text, len(text))


@pytest.mark.parametrize(
    "bad, message",
    [
        ("boom", r"item_cost picky_cost raised RuntimeError for input 1: cannot tokenize"),
        ("none", r"item_cost picky_cost of input 1 must be a finite number > 0, got None"),
        ("zero", r"item_cost picky_cost of input 1 must be a finite number > 0, got 0"),
        ("nan", r"must be a finite number > 0, got nan"),
        ("neg", r"must be a finite number > 0, got -2"),
        ("word", r"must be a finite number > 0, got 'ten'"),
        ("flag", r"must be a finite number > 0, got True"),
    ],
)
def test_an_input_that_cannot_be_costed_fails_its_own_call_only(closing, bad, message):
    model = Recorder()
    streamer = closing(ThreadedStreamer(model, batch_size=8, max_latency=0.01, item_cost=picky_cost))
    with pytest.raises(ItemCostError, match=message) as info:
        streamer.predict(["fine", bad])
    assert isinstance(info.value, ValueError)
    assert all("fine" not in batch for batch in model.batches), "a refused call's other inputs reached the model"
    assert streamer.predict(["still", "fine"]) == [5, 4]


@pytest.mark.parametrize(
    "options, error, message",
    [
        ({"max_batch_cost": 0}, ValueError, r"max_batch_cost must be a finite number > 0, got 0"),
        ({"max_batch_cost": -5}, ValueError, r"max_batch_cost must be a finite number > 0"),
        ({"max_batch_cost": math.inf}, ValueError, r"max_batch_cost must be a finite number > 0, got inf"),
        ({"max_batch_cost": "512"}, TypeError, r"max_batch_cost must be a finite number > 0, got '512' \(str\)"),
        ({"item_cost": 3}, TypeError, r"item_cost must be a function of one input"),
        ({"batch_cost": "mean"}, ValueError, r"batch_cost must be 'max' .* or 'sum' .*got 'mean'"),
    ],
)
def test_wrong_cost_options_are_refused_when_the_streamer_is_made(options, error, message):
    with pytest.raises(error, match=message):
        ThreadedStreamer(models.double, batch_size=8, **options)


# -- the process backend ------------------------------------------------------


def test_the_process_backend_honours_the_budget(closing):
    """``item_cost`` runs in the web process (a lambda: it need not pickle);
    the workers get batches within the budget."""
    streamer = closing(
        Streamer(
            models.with_batch,
            batch_size=8,
            max_latency=0.02,
            worker_num=2,
            item_cost=lambda x: x,
            max_batch_cost=12,
            batch_cost="sum",
        )
    )
    assert streamer.wait_ready(60)
    inputs = [1 + (5 * i) % 6 for i in range(200)] + [30]
    with ThreadPoolExecutor(24) as pool:
        outputs = list(pool.map(lambda x: streamer.predict([x])[0], inputs))
    assert [x for x, _ in outputs] == inputs
    batches = {tuple(batch) for _, batch in outputs}
    for batch in batches:
        assert len(batch) <= 8 and (len(batch) == 1 or sum(batch) <= 12), f"over the budget: {batch}"
    assert (30,) in batches, "the input over the budget should run alone"
    assert any(len(batch) > 1 for batch in batches), "nothing was ever batched"


@pytest.mark.parametrize("rule, costs", [("max", [10.0, 1.0]), ("sum", [10.0, 6.0])])
def test_a_batch_full_by_its_budget_goes_at_once_to_a_busy_worker(rule, costs):
    """Two calls, a costly input then a cheap one, together over the budget
    (15): the batch is as full as it can be, so the worker busy with
    another gets it next at once, as it would get a batch full by count.
    The scheduler tells that from a bound on what the queued inputs cost,
    kept as they arrive: it must stay an upper bound (the costliest so far,
    or the sum), not become the last input's cost."""
    config = BatchingConfig(64, 10.0, timeout=30, item_cost=len, max_batch_cost=15, batch_cost=rule)
    scheduler = Scheduler(config)
    scheduler.add_slot()
    scheduler.put(["first"], 30, [1.0])
    first = scheduler.next_batch()
    assert first is not None and first[1] == 0  # the worker now runs it: busy
    for cost in costs:
        scheduler.put([cost], 30, [cost])
    handed: List[Any] = []
    taker = threading.Thread(target=lambda: handed.append(scheduler.next_batch()))
    taker.start()
    taker.join(10)  # without the bound, until the worker's first batch is done: never, here
    scheduler.stop(lambda: RuntimeError("test over"))
    taker.join(10)
    assert handed and handed[0] is not None, "the full batch was held back from the busy worker"
    batch, held = handed[0]
    assert held == 1 and [item.cost for item in batch] == [costs[0]], (held, [item.cost for item in batch])
