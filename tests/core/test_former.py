"""The batch former (:mod:`streamer_core.batching.former`) on its own: the one rule
by which both the in-process scheduler and a Redis worker form batches."""

from __future__ import annotations

import math
from typing import List

import pytest

from streamer_core import BatchingConfig
from streamer_core.batching.former import BatchFormer


class Input:
    def __init__(self, name: str, arrival: float, cost: float = 1.0, live: bool = True) -> None:
        self.name, self.arrival, self.cost, self.live = name, arrival, cost, live


def names(batch: List[Input]) -> List[str]:
    return [each.name for each in batch]


def former(batch_size: int = 4, max_latency: float = 0.5, **options: object) -> BatchFormer[Input]:
    config = BatchingConfig(batch_size, max_latency, **options)  # type: ignore[arg-type]
    return BatchFormer(config, costed=config.item_cost is not None or "max_batch_cost" in options, live=_live)


def _live(each: Input) -> bool:
    return each.live


def test_a_lone_input_goes_at_once_when_no_caller_is_due():
    formed = former()
    formed.add([Input("a", 0.0)])
    batch, _ = formed.decide(now=0.0)
    assert batch is not None and names(batch) == ["a"]
    assert formed.decide(now=0.0) == (None, math.inf)


def test_a_full_batch_goes_at_once_and_the_rest_waits_in_order():
    formed = former(batch_size=2)
    formed.policy.delivered(4, 0.2, now=0.0)  # four callers due back: worth waiting for
    formed.add([Input(x, 0.0) for x in "abc"])
    batch, _ = formed.decide(now=0.001)
    assert batch is not None and names(batch) == ["a", "b"]
    batch, hold_until = formed.decide(now=0.001)
    assert batch is None and 0.001 < hold_until <= 0.5, "c waits for the callers due, within max_latency"
    batch, _ = formed.decide(now=0.5)
    assert batch is not None and names(batch) == ["c"]


def test_exactly_a_batch_goes_at_once_though_callers_are_due():
    formed = former(batch_size=3)
    formed.policy.delivered(4, 0.2, now=0.0)  # callers due back: worth waiting for, were there room
    formed.add([Input(x, 0.0) for x in "abc"])
    batch, _ = formed.decide(now=0.001)
    assert batch is not None and names(batch) == ["a", "b", "c"], "a full batch has no room to wait for"


@pytest.mark.parametrize("options", [{}, {"max_batch_cost": 100}], ids=["by count", "by cost"])
def test_given_up_inputs_among_live_ones_are_dropped_as_the_batch_is_taken(options):
    """Given-up inputs behind a live one (a failed request's inputs queued
    after another caller's) are met inside the batch, not at the head."""
    formed = former(batch_size=4, **options)
    formed.add([Input("a", 0.0), Input("gone1", 0.0, live=False), Input("gone2", 0.0, live=False), Input("d", 0.0)])
    formed.add([Input("e", 0.0)])
    batch, _ = formed.decide(now=1.0)
    assert batch is not None and names(batch) == ["a", "d", "e"]


def test_never_past_max_latency_from_the_oldest_arrival():
    formed = former(max_latency=0.1)
    formed.policy.delivered(100, 10.0, now=0.0)  # a long batch and many due: a long patience
    formed.add([Input("a", 0.0)])
    _, hold_until = formed.decide(now=0.0)
    assert hold_until == 0.1
    formed.add([Input("b", 0.09)])
    _, hold_until = formed.decide(now=0.09)
    assert hold_until == 0.1, "counted from the oldest input's arrival, not the newest"


def test_inputs_to_run_alone_go_first_and_one_by_one():
    formed = former()
    formed.add([Input("a", 0.0), Input("b", 0.0)])
    formed.add_alone([Input("x", 1.0), Input("gone", 1.0, live=False), Input("y", 1.0)])
    assert formed.alone_waiting()
    assert [names(formed.decide(now=2.0)[0] or []) for _ in range(3)] == [["x"], ["y"], ["a", "b"]]
    assert not formed.alone_waiting()


def test_given_up_inputs_are_dropped_and_go_now_takes_what_waits():
    formed = former()
    formed.policy.delivered(4, 1.0, now=0.0)
    formed.add([Input("gone", 0.0, live=False), Input("a", 0.0)])
    assert formed.decide(now=0.0)[0] is None  # held for the callers due
    batch, _ = formed.decide(now=0.0, go_now=True)
    assert batch is not None and names(batch) == ["a"]


def test_put_back_puts_inputs_at_the_head_in_their_order():
    formed = former(batch_size=8)
    formed.add([Input("c", 0.0)])
    formed.put_back([Input("a", 0.0), Input("b", 0.0)])
    assert names(formed.take()) == ["a", "b", "c"]


def test_by_cost_the_budget_fills_a_batch_and_like_costs_go_together():
    formed = former(batch_size=8, max_batch_cost=10, item_cost=len, batch_cost="sum")
    formed.add([Input("long", 0.0, 6.0), Input("short", 0.0, 1.0), Input("long2", 0.0, 5.0)])
    assert formed.full(), "11 of cost waits against a budget of 10: as full as a batch can be"
    assert names(formed.take()) == ["long", "short"], "long2 is closer in cost, but over the budget with long"
    assert not formed.full() and names(formed.take()) == ["long2"]
    formed = former(batch_size=8, max_batch_cost=10, item_cost=len, batch_cost="max")
    formed.add([Input("a", 0.0, 4.0), Input("b", 0.0, 1.0), Input("c", 0.0, 4.0)])
    assert names(formed.take()) == ["a", "c"], "the oldest, then the closest in cost, within the budget"
    assert names(formed.take()) == ["b"]
