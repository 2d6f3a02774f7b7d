"""Calls of more inputs than a batch holds take turns with the others
(:meth:`streamer_core.batching.former.BatchFormer.add_call`): one batch's worth of
such a call waits in line, the rest joins it a batch at a time, so a call
of thousands of inputs delays the calls after it by about a batch."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any, Dict, List, Tuple

import pytest

from streamer_core import BatchingConfig, QueueFullError, Streamer, ThreadedStreamer
from streamer_core.batching.former import GATED_RECHECK_S, BatchFormer
from streamer_core.batching.levels import LeveledQueue
from tests.core import models
from tests.helpers import wait_for


class Input:
    def __init__(self, name: str, level: int = 0) -> None:
        self.name, self.arrival, self.cost, self.level, self.live = name, 0.0, 1.0, level, True


def call(prefix: str, n: int, level: int = 0) -> List[Input]:
    return [Input(f"{prefix}{i}", level) for i in range(n)]


def names(batch: Any) -> List[str]:
    return [each.name for each in batch]


def former(batch_size: int = 4, dropped: Any = None) -> BatchFormer[Input]:
    return BatchFormer(BatchingConfig(batch_size, 0.0), costed=False, live=lambda each: each.live, dropped=dropped)


def test_the_call_after_a_large_one_goes_in_the_second_batch() -> None:
    formed = former()
    formed.add_call(call("a", 10))
    formed.add_call([Input("b")])
    assert formed.in_queue() == 11 and len(formed) == 11
    assert names(formed.take()) == ["a0", "a1", "a2", "a3"]
    assert names(formed.take()) == ["b", "a4", "a5", "a6"]
    assert names(formed.take()) == ["a7", "a8", "a9"]
    assert formed.in_queue() == 0 and formed.decide(now=0.0) == (None, float("inf"))


def test_two_large_calls_take_turns_each_in_its_order() -> None:
    formed = former()
    formed.add_call(call("a", 12))
    formed.add_call(call("b", 12))
    batches = []
    while len(formed):
        batch, _ = formed.decide(now=0.0)
        assert batch is not None
        batches.append(names(batch))
    assert batches == [
        ["a0", "a1", "a2", "a3"], ["b0", "b1", "b2", "b3"], ["a4", "a5", "a6", "a7"],
        ["b4", "b5", "b6", "b7"], ["a8", "a9", "a10", "a11"], ["b8", "b9", "b10", "b11"],
    ]  # fmt: skip


def test_a_large_call_is_not_starved_by_a_steady_line_of_small_ones() -> None:
    formed = former()
    formed.add_call(call("a", 12))
    taken: List[str] = []
    for round_ in range(8):
        formed.add_call(call(f"s{round_}-", 4))  # a batch of small calls comes before every take
        taken += names(formed.take())
    assert [n for n in taken if n.startswith("a")] == [f"a{i}" for i in range(12)]


def test_every_waiting_input_is_counted_listed_and_cleared_parked_ones_too() -> None:
    formed = former()
    formed.add_call(call("a", 10))
    formed.add([Input("b")])
    assert sorted(names(formed)) == sorted([f"a{i}" for i in range(10)] + ["b"])
    formed.clear()
    assert formed.in_queue() == 0 and len(formed) == 0 and list(formed) == []
    assert formed.decide(now=0.0) == (None, float("inf"))


def test_a_given_up_large_calls_parked_inputs_are_dropped_unrun() -> None:
    dropped: List[str] = []
    formed = former(dropped=lambda each: dropped.append(each.name))
    given_up = call("a", 10)
    formed.add_call(given_up)
    formed.add_call(call("b", 2))
    for each in given_up:
        each.live = False
    batch, _ = formed.decide(now=0.0)
    assert batch is not None and names(batch) == ["b0", "b1"]
    assert formed.decide(now=0.0) == (None, float("inf"))
    assert sorted(dropped) == sorted(names(given_up)) and formed.in_queue() == 0
    # Alone in line, given up: nothing is taken, and its parked inputs go too.
    alone = call("d", 10)
    formed.add_call(alone)
    for each in alone:
        each.live = False
    assert formed.decide(now=0.0) == (None, float("inf")) and formed.in_queue() == 0
    assert len(dropped) == 20
    # And compact() drops parked ones as well.
    again = call("c", 10)
    formed.add_call(again)
    for each in again:
        each.live = False
    formed.compact()
    assert formed.in_queue() == 0


def leveled_former(config: BatchingConfig) -> BatchFormer[Input]:
    """A former of one line per priority level."""
    return BatchFormer(config, costed=False, live=lambda each: each.live, queue=LeveledQueue(config))


def test_with_levels_parked_inputs_count_in_their_level() -> None:
    config = BatchingConfig(4, 0.0, priority_levels=2)
    formed: BatchFormer[Input] = leveled_former(config)
    formed.add_call(call("low", 10, level=1))
    formed.add_call([Input("high", level=0)])
    assert formed.in_level(1) == 10 and formed.in_level(0) == 1 and formed.levels_waiting() == [1, 10]
    assert names(formed.take()) == ["high", "low0", "low1", "low2"]
    assert formed.in_level(1) == 7 and formed.in_queue() == 7


# -- through a streamer ---------------------------------------------------------------


def test_calls_after_a_large_one_are_answered_before_its_last_batch_runs() -> None:
    gate = threading.Event()
    batches: List[List[str]] = []

    def predict(batch: List[str]) -> List[str]:
        gate.wait(10)
        batches.append(list(batch))
        return [x.upper() for x in batch]

    streamer = ThreadedStreamer(predict, batch_size=4, max_latency=0.0)
    try:
        large = streamer.submit([f"a{i}" for i in range(40)])
        deadline = time.monotonic() + 5
        while streamer.stats().queue_depth > 32 and time.monotonic() < deadline:  # its first batches handed out
            time.sleep(0.01)
        small = [streamer.submit([f"s{i}"]) for i in range(3)]
        time.sleep(0.05)
        gate.set()
        assert large.result(10) == [f"A{i}" for i in range(40)]
        assert [f.result(10) for f in small] == [["S0"], ["S1"], ["S2"]]
    finally:
        streamer.close()
    where = next(i for i, batch in enumerate(batches) if "s0" in batch)
    assert where <= 3, f"the small calls waited for {where} of the large call's 10 batches: {batches}"


def test_a_full_queue_counts_the_parked_inputs_of_a_large_call() -> None:
    gate = threading.Event()

    def predict(batch: List[int]) -> List[int]:
        gate.wait(10)
        return batch

    streamer = ThreadedStreamer(predict, batch_size=4, max_latency=0.0, max_queue=50)
    try:
        first = streamer.submit(list(range(48)))
        with pytest.raises(QueueFullError):
            streamer.submit(list(range(20)))
        gate.set()
        assert first.result(10) == list(range(48))
    finally:
        gate.set()
        streamer.close()


def test_close_runs_a_large_calls_parked_inputs_before_it_ends() -> None:
    streamer = ThreadedStreamer(lambda batch: [x * 2 for x in batch], batch_size=4, max_latency=0.0)
    future = streamer.submit(list(range(100)))
    streamer.close(timeout=10)
    assert future.result(0) == [x * 2 for x in range(100)]


def test_on_the_process_backend_calls_after_a_large_one_run_before_its_last_batch(closing, tmp_path: Path) -> None:
    (tmp_path / "hold").write_text("")
    folder = {"folder": str(tmp_path)}
    streamer = closing(Streamer(models.RecordingGate, 4, 0.01, model_init_kwargs=folder, timeout=30, worker_num=1))
    assert streamer.wait_ready(60)
    held = streamer.submit(["hold"])
    assert wait_for(lambda: (tmp_path / "inside").exists(), 10), "the held batch never reached the model"
    large = streamer.submit([f"a{i}" for i in range(40)])
    small = [streamer.submit([f"s{i}"]) for i in range(3)]
    (tmp_path / "hold").unlink()
    assert held.result(20) == ["ok:hold"]
    assert large.result(20) == [f"ok:a{i}" for i in range(40)]
    assert [f.result(20) for f in small] == [["ok:s0"], ["ok:s1"], ["ok:s2"]]
    batches = models.ran_batches(tmp_path)
    where = next(i for i, batch in enumerate(batches) if "s0" in batch)
    assert where <= 3, f"the small calls waited for {where - 1} of the large call's 10 batches: {batches}"


def test_batches_smaller_than_batch_size_let_in_only_as_many_as_they_took() -> None:
    """Shaped by cost, each batch holds 2 of its 8: the line stays at two
    batches' worth (16), so a query added after five batches runs in the
    9th batch after it, not later."""
    config = BatchingConfig(8, 0.0, item_cost=lambda x: 10.0, max_batch_cost=20.0, batch_cost="sum")
    formed: BatchFormer[Input] = BatchFormer(config, costed=True, live=lambda each: each.live)
    for each in (large := call("a", 200)):
        each.cost = 10.0
    formed.add_call(large)
    for _ in range(5):
        assert len(formed.take()) == 2
    query = Input("q")
    query.cost = 10.0
    formed.add_call([query])
    taken = 0
    while True:
        taken += 1
        if "q" in names(formed.take()):
            break
    assert taken == 9


def test_a_small_given_up_call_behind_a_large_live_one_does_not_compact_the_queue() -> None:
    """Given-up inputs are dropped all at once when they are more than half
    of what waits, parked inputs counted: 9 of 1,009 are not."""
    dropped: List[str] = []
    formed = former(batch_size=8, dropped=lambda each: dropped.append(each.name))
    formed.add_call(call("a", 1000))
    gone = call("g", 9)
    formed.add_call(gone)
    for each in gone:
        each.live = False
    formed.given_up(9)
    assert formed.in_queue() == 1009 and dropped == []
    # More than half given up: they go at once.
    for each in formed:
        each.live = False
    formed.given_up(1000)
    assert formed.in_queue() == 0 and len(dropped) == 1009


def test_with_levels_the_highest_levels_parked_calls_join_the_line_first() -> None:
    """A large call of priority 1 beside one of priority 2: each batch
    taken lets in the next of the higher's inputs, so every batch of it
    goes before the lower's (its first batch's worth, in line before the
    higher came, goes first only among the lower's)."""
    config = BatchingConfig(4, 0.0, priority_levels=2)
    formed: BatchFormer[Input] = leveled_former(config)
    formed.add_call(call("low", 12, level=1))
    formed.add_call(call("high", 12, level=0))
    batches = [names(formed.take()) for _ in range(6)]
    assert [batch[0][:-1].rstrip("0123456789") for batch in batches] == ["high"] * 3 + ["low"] * 3, batches
    assert batches[3:] == [[f"low{i}" for i in range(4 * n, 4 * n + 4)] for n in range(3)]


def test_with_aging_a_lower_call_that_waited_long_keeps_its_turn() -> None:
    """Aged to the highest level (it came 100 s ago; one level a second),
    the lower call is served as the higher, and older: its parked inputs
    join the line before the newer higher call's."""
    config = BatchingConfig(4, 0.0, priority_levels=2, priority_aging=1.0)
    formed: BatchFormer[Input] = leveled_former(config)
    low, high = call("low", 12, level=1), call("high", 12, level=0)
    for each in low:
        each.arrival = time.monotonic() - 100.0
    for each in high:
        each.arrival = time.monotonic()
    formed.add_call(low)
    formed.add_call(high)
    assert names(formed.take()) == ["low0", "low1", "low2", "low3"]
    assert names(formed.take()) == ["low4", "low5", "low6", "low7"]


def gated(limit: int) -> Tuple[BatchFormer[Input], Dict[str, int], List[Input]]:
    """A former whose large calls may have ``limit`` inputs out
    (:meth:`BatchFormer.gate_parked`, as a Redis web process's), each
    call's unanswered count kept by its name's letters, and what it dropped."""
    remaining: Dict[str, int] = {}
    dropped: List[Input] = []
    formed = former(dropped=dropped.append)
    formed.gate_parked(lambda: limit, lambda each: remaining[each.name.rstrip("0123456789")])
    return formed, remaining, dropped


def test_a_gated_call_waits_for_its_answers_and_keeps_its_turn() -> None:
    formed, remaining, _ = gated(limit=4)
    remaining.update(a=10, b=10)
    formed.add_call(call("a", 10))
    formed.add_call(call("b", 10))
    assert names(formed.take()) == ["a0", "a1", "a2", "a3"]
    assert names(formed.take()) == ["b0", "b1", "b2", "b3"]
    assert formed.decide(now=0.0)[0] is None, "both calls have four out: nothing more goes"
    remaining["b"] -= 4  # b's first four answered: b may go on, a still waits
    assert names(formed.decide(now=0.0)[0]) == ["b4", "b5", "b6", "b7"]
    remaining["a"] -= 4
    remaining["b"] -= 4
    # a waited at its gate while b went on: it kept its turn, ahead of b's last two.
    assert names(formed.decide(now=0.0)[0]) == ["a4", "a5", "a6", "a7"]


def test_a_gated_call_that_ended_is_dropped_not_held() -> None:
    formed, remaining, dropped = gated(limit=4)
    remaining["a"] = 10
    inputs = call("a", 10)
    formed.add_call(inputs)
    assert names(formed.take()) == ["a0", "a1", "a2", "a3"]
    for each in inputs:
        each.live = False  # its caller gave up, with four out and six at the gate
    assert formed.decide(now=0.0) == (None, float("inf"))
    assert formed.in_queue() == 0 and names(dropped) == [f"a{i}" for i in range(4, 10)]


def test_a_gated_former_looks_again_only_while_inputs_wait_at_a_gate() -> None:
    formed, remaining, _ = gated(limit=4)
    assert not formed.gated and formed.decide(now=0.0) == (None, float("inf")), "nothing held: no look again"
    remaining["a"] = 6
    formed.add_call(call("a", 6))
    assert formed.gated
    assert names(formed.take()) == ["a0", "a1", "a2", "a3"]
    assert formed.decide(now=0.0) == (None, GATED_RECHECK_S), "two held: it looks again"
    remaining["a"] = 2
    assert names(formed.decide(now=0.0)[0]) == ["a4", "a5"]
    assert not formed.gated and formed.decide(now=0.0) == (None, float("inf"))
