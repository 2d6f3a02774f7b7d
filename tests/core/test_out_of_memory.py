"""Out of memory: a batch that runs out is split and its halves retried,
whatever ``isolate_errors`` says, so no caller sees the error unless its
input alone is too big; and the streamer caps later batches at the cost of
what ran, letting the cap creep back up after a run of good batches."""

from __future__ import annotations

import logging
import math
import threading
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any, List

import pytest

from streamer_core import Streamer, ThreadedStreamer, WorkerStartError
from streamer_core.batching.shaping import GOOD_RUN
from tests.core import models
from tests.core.models import FakeOutOfMemory


class MemoryBound:
    """A model for the thread backend that runs out of memory on any batch
    whose cost (``cost(batch)``) is over ``limit``, a limit the streamer is
    not told; it records every call and whether it ran out."""

    def __init__(self, limit: float, cost=sum, error: type = FakeOutOfMemory) -> None:
        self.limit, self.cost, self.error = limit, cost, error
        self.calls: List[tuple] = []
        self.lock = threading.Lock()

    def __call__(self, batch: List[Any]) -> List[Any]:
        over = self.cost(batch) > self.limit
        with self.lock:
            self.calls.append((list(batch), over))
        if over:
            raise self.error(f"a batch costing {self.cost(batch)} does not fit in {self.limit}")
        return [x * 2 for x in batch]

    def ran_out(self, calls: List[tuple]) -> int:
        return sum(over for _, over in calls)


def run_load(streamer: Any, inputs: List[Any], threads: int = 32) -> List[Any]:
    with ThreadPoolExecutor(threads) as pool:
        return list(pool.map(lambda x: streamer.predict([x])[0], inputs))


def test_no_caller_sees_running_out_and_later_batches_stop_running_out(closing, caplog):
    """With ``isolate_errors`` off: every call is answered, the cap is learned
    from the first batch that ran out, and afterwards few batches run out
    (only when the cap creeps back up to try for more)."""
    model = MemoryBound(limit=40)
    streamer = closing(
        ThreadedStreamer(
            model,
            batch_size=16,
            max_latency=0.02,
            isolate_errors=False,
            item_cost=float,
            batch_cost="sum",
            oom_errors=(FakeOutOfMemory,),
            name=f"oom-{uuid.uuid4().hex[:8]}",
        )
    )
    inputs = [1 + (7 * i) % 10 for i in range(1500)]
    with caplog.at_level(logging.WARNING, logger="streamer_core"):
        assert run_load(streamer, inputs) == [x * 2 for x in inputs], "a caller saw the error"
    assert model.ran_out(model.calls) >= 1, "the load never ran out of memory: the test proves nothing"
    cap = streamer._engine.scheduler.cost_cap
    assert cap <= 40 * 1.25**2, f"the cap learned ({cap}) is far over what fits"
    # Every call that ran out was split (no input alone is over the limit),
    # and the stats (the metrics' source) say so, and show the cap.
    stats = streamer.stats()
    assert stats.oom_splits == model.ran_out(model.calls)
    assert stats.batch_cost_cap == cap
    later = [call for call in model.calls[len(model.calls) // 2 :] if len(call[0]) > 0]
    share = model.ran_out(later) / len(later)
    assert share < 0.15, f"{share:.0%} of the later model calls still ran out of memory"
    lines = [r.getMessage() for r in caplog.records if "capped at" in r.getMessage()]
    assert lines and all(r.levelno == logging.WARNING for r in caplog.records if "capped at" in r.getMessage())
    assert any("out of memory on a batch costing" in line for line in lines), lines
    assert all(a != b for a, b in zip(lines, lines[1:])), "a change was logged twice"


def test_without_item_cost_the_cap_is_on_the_count(closing):
    model = MemoryBound(limit=5, cost=len)
    streamer = closing(
        ThreadedStreamer(model, batch_size=16, max_latency=0.02, isolate_errors=False, oom_errors=(FakeOutOfMemory,))
    )
    inputs = list(range(800))
    assert run_load(streamer, inputs) == [x * 2 for x in inputs]
    assert model.ran_out(model.calls) >= 1
    assert 1 <= streamer._engine.scheduler.cost_cap <= 5 * 1.25**2
    later = model.calls[len(model.calls) // 2 :]
    assert model.ran_out(later) / len(later) < 0.15


def test_an_input_too_big_alone_fails_its_caller_only(closing):
    model = MemoryBound(limit=40)
    streamer = closing(
        ThreadedStreamer(model, batch_size=8, max_latency=0.05, isolate_errors=False, oom_errors=(FakeOutOfMemory,))
    )
    calls = [streamer.submit([x]) for x in (3, 100, 4, 5)]
    assert calls[0].result(5) == [6] and calls[2].result(5) == [8] and calls[3].result(5) == [10]
    with pytest.raises(FakeOutOfMemory, match="costing 100"):
        calls[1].result(5)


def test_other_errors_are_not_split_when_isolation_is_off(closing):
    """Only the out-of-memory errors split a batch with ``isolate_errors``
    off: any other error fails the whole batch, as it did."""
    model = MemoryBound(limit=40, error=ValueError)
    streamer = closing(
        ThreadedStreamer(model, batch_size=8, max_latency=0.2, isolate_errors=False, oom_errors=(FakeOutOfMemory,))
    )
    calls = [streamer.submit([x]) for x in (30, 30)]
    for call in calls:
        with pytest.raises(ValueError):
            call.result(5)
    assert math.isinf(streamer._engine.scheduler.cost_cap)


def test_torchs_error_is_the_default_once_torch_is_loaded(closing):
    torch = pytest.importorskip("torch")
    model = MemoryBound(limit=3, cost=len, error=torch.cuda.OutOfMemoryError)
    streamer = closing(ThreadedStreamer(model, batch_size=16, max_latency=0.02, isolate_errors=False))
    inputs = list(range(300))
    assert run_load(streamer, inputs) == [x * 2 for x in inputs]
    assert model.ran_out(model.calls) >= 1
    assert streamer._engine.scheduler.cost_cap <= 3 * 1.25**2


def test_a_process_worker_splits_and_the_parent_learns(closing):
    streamer = closing(
        Streamer(
            models.MemoryBoundModel,
            batch_size=16,
            max_latency=0.02,
            model_init_kwargs={"limit": 40},
            isolate_errors=False,
            item_cost=float,
            batch_cost="sum",
            oom_errors=(FakeOutOfMemory,),
            name=f"oom-process-{uuid.uuid4().hex[:8]}",
        )
    )
    assert streamer.wait_ready(60)
    inputs = [1 + (7 * i) % 10 for i in range(1200)]
    outputs = run_load(streamer, inputs)
    assert [doubled for doubled, _ in outputs] == [x * 2 for x in inputs], "a caller saw the error"
    times_ran_out = max(count for _, count in outputs)
    assert times_ran_out >= 1, "the worker never ran out: the test proves nothing"
    assert streamer._engine.scheduler.cost_cap <= 40 * 1.25**2
    # The worker tells its parent how many times it split a batch.
    assert streamer.stats().oom_splits == times_ran_out
    assert streamer.stats().batch_cost_cap == streamer._engine.scheduler.cost_cap
    # Each good run of GOOD_RUN batches may try once for more: far fewer
    # times out of memory than batches.
    assert times_ran_out <= 10 + len(inputs) / 4 / GOOD_RUN


def test_a_worker_process_caps_at_the_cost_of_the_largest_part_that_ran(closing):
    """A batch of sixteen inputs of cost 5 runs out of memory in a worker
    (it fits 40): its halves of eight run, and the cap learned is theirs, 40,
    exactly as on the thread backend."""
    streamer = closing(
        Streamer(
            models.MemoryBoundModel, batch_size=16, max_latency=0.2, model_init_kwargs={"limit": 40},
            isolate_errors=False, item_cost=float, batch_cost="sum", oom_errors=(FakeOutOfMemory,),
            name=f"oom-cap-{uuid.uuid4().hex[:8]}",
        )
    )  # fmt: skip
    assert streamer.wait_ready(60)
    assert [doubled for doubled, _ in streamer.predict([5] * 16, timeout=30)] == [10] * 16
    assert streamer.stats().oom_splits == 1
    assert streamer.stats().batch_cost_cap == 40


def test_no_oom_errors_turns_splitting_off_with_torch_loaded(closing):
    """``oom_errors=()`` names no error at all, torch's included: a batch
    that runs out of memory fails as any model error does, unsplit, and no
    cap is learned."""
    torch = pytest.importorskip("torch")
    model = MemoryBound(limit=3, cost=len, error=torch.cuda.OutOfMemoryError)
    streamer = closing(ThreadedStreamer(model, batch_size=16, max_latency=0.2, isolate_errors=False, oom_errors=()))
    with pytest.raises(torch.cuda.OutOfMemoryError):
        streamer.predict(list(range(8)), timeout=10)
    assert [batch for batch, _ in model.calls] == [list(range(8))], f"the batch was split: {model.calls}"
    assert streamer.stats().oom_splits == 0
    assert math.isinf(streamer._engine.scheduler.cost_cap)


@pytest.mark.parametrize("value", ["torch", [ValueError, "x"], 3])
def test_oom_errors_must_be_exception_types(value):
    with pytest.raises(TypeError, match=r"oom_errors must be a tuple of exception types"):
        ThreadedStreamer(models.double, batch_size=4, oom_errors=value)


class TransientOutOfMemory(MemoryBound):
    """Runs out of memory on big batches only while ``short`` is set (memory
    another process held for a while); answers like MemoryBound."""

    def __init__(self, limit: float) -> None:
        super().__init__(limit, cost=len)
        self.short = True

    def __call__(self, batch: List[Any]) -> List[Any]:
        if not self.short:
            with self.lock:
                self.calls.append((list(batch), False))
            return [x * 2 for x in batch]
        return super().__call__(batch)


def test_a_learned_cap_rises_again_after_good_batches_and_is_lifted(closing, caplog):
    """Memory is shared: what did not fit once may fit later. After a run of
    GOOD_RUN good batches near the cap, the cap grows, and once it passes
    the ceiling (here the batch size) it is lifted; until then it never
    falls without a new out-of-memory error. (Every other test bounds the cap
    from above only: a cap that never rose again passed them all.)"""
    model = TransientOutOfMemory(limit=4)
    streamer = closing(
        ThreadedStreamer(model, batch_size=16, max_latency=0.05, isolate_errors=False, oom_errors=(FakeOutOfMemory,))
    )
    scheduler = streamer._engine.scheduler
    assert run_load(streamer, list(range(64)), threads=16) == [x * 2 for x in range(64)]
    learned = scheduler.cost_cap
    assert learned <= 4, f"no cap learned from running out: {learned}"
    model.short = False  # the memory is back
    caps = [learned]
    with caplog.at_level(logging.WARNING, logger="streamer_core"):
        for _ in range(60):
            if math.isinf(caps[-1]):
                break
            run_load(streamer, list(range(64)), threads=16)
            caps.append(scheduler.cost_cap)
    assert math.isinf(caps[-1]), f"the cap never came back up: {caps}"
    finite = [cap for cap in caps if not math.isinf(cap)]
    assert all(a <= b for a, b in zip(finite, finite[1:])), f"the cap fell with no error: {finite}"
    assert len(set(finite)) >= 2, f"the cap was lifted without growing first: {finite}"
    assert any("batches ran near the cap" in r.getMessage() for r in caplog.records)
    # Sixteen inputs arriving together (one call: under load, sixteen callers
    # of one input each may not be waiting at once) run as one batch again.
    assert streamer.predict(list(range(16))) == [x * 2 for x in range(16)]
    assert len(model.calls[-1][0]) > 4, "batches past the old cap run again"


def test_the_cost_cap_grows_by_its_rule():
    from streamer_core.batching.shaping import GROWTH, CostCap

    cap = CostCap(ceiling=100.0)
    cap.ran_out(cost=64, fitted=16)
    assert cap.limit == 16
    for _ in range(GOOD_RUN * 3):
        cap.ran(7)  # under half the cap: not a sign that more would fit
    assert cap.limit == 16
    for _ in range(GOOD_RUN - 1):
        cap.ran(8)
    assert cap.limit == 16
    cap.ran(8)
    assert cap.limit == 16 * GROWTH
    cap.ran_out(cost=20, fitted=10)
    assert cap.limit == 10, "a new error caps it again, lower"
    while not math.isinf(cap.limit):
        before = cap.limit
        for _ in range(GOOD_RUN):
            cap.ran(before)
        assert cap.limit > before or math.isinf(cap.limit)


@pytest.mark.parametrize("device", [0, 3])
def test_a_model_that_runs_out_of_memory_loading_says_what_to_look_at(closing, device):
    """A worker whose device another process holds: the error names the
    device (device 0 too: the first GPU is a device, not none), says what
    to check, and keeps the model's own message."""
    streamer = closing(
        Streamer(models.NoRoomToLoad, batch_size=4, worker_num=1, cuda_devices=[device], oom_errors=(FakeOutOfMemory,))
    )
    with pytest.raises(WorkerStartError) as info:
        streamer.wait_ready(60)
    message = str(info.value)
    assert f"ran out of memory on device {device} while it loaded" in message
    assert "nvidia-smi" in message and "0 bytes free" in message


class MoreSpecificOutOfMemory(FakeOutOfMemory):
    """A subclass of the configured out-of-memory type, as a framework's
    device-specific error subclasses its generic one."""


def test_a_subclass_of_a_configured_out_of_memory_type_splits_the_batch_too(closing):
    """``oom_errors`` names types, as ``except`` clauses do: an error of a
    subclass of one of them is out of memory as well, and its batch is split."""
    model = MemoryBound(limit=40, error=MoreSpecificOutOfMemory)
    streamer = closing(
        ThreadedStreamer(model, batch_size=8, max_latency=0.2, isolate_errors=False, oom_errors=(FakeOutOfMemory,))
    )
    calls = [streamer.submit([x]) for x in (30, 30)]
    assert [call.result(5) for call in calls] == [[60], [60]]
    assert model.ran_out(model.calls) >= 1


def test_running_out_of_memory_breaks_the_run_of_good_batches_that_lifts_the_cap():
    """The cap grows after GOOD_RUN good batches *in a row*: a batch that
    runs out of memory in between (even one whose input alone was too big,
    which leaves the cap as it is) starts the count again."""
    from streamer_core.batching.shaping import GROWTH, CostCap

    cap = CostCap(ceiling=10_000)
    cap.ran_out(100, 40)
    assert cap.limit == 40
    for _ in range(GOOD_RUN - 1):
        cap.ran(30)
    cap.ran_out(50, 0)  # one input alone did not fit: no new cap, but the run is broken
    cap.ran(30)
    assert cap.limit == 40, "the cap grew on a run broken by running out of memory"
    for _ in range(GOOD_RUN - 2):
        cap.ran(30)
    assert cap.limit == 40
    cap.ran(30)
    assert cap.limit == 40 * GROWTH
