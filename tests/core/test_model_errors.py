"""A model that raises or misbehaves: the right callers get a clear error,
everyone else their result, and the worker keeps serving."""

from __future__ import annotations

import concurrent.futures
import json
import time
import traceback
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable

import pytest

from streamer_core import (
    BatchLengthError,
    RemoteTraceback,
    SerializationError,
    Streamer,
    ThreadedStreamer,
    WorkerDiedError,
)
from tests.core import models
from tests.helpers import wait_for


def make_thread(model: Callable, **options: Any) -> ThreadedStreamer:
    return ThreadedStreamer(model, batch_size=16, max_latency=0.05, **options)


def make_process(model: Callable, **options: Any) -> Streamer:
    streamer = Streamer(model, batch_size=16, max_latency=0.05, **options)
    assert streamer.wait_ready(60)
    return streamer


BACKENDS = [pytest.param(make_thread, id="thread"), pytest.param(make_process, id="process")]


def submit_together(streamer: Any, inputs: list) -> list:
    """Submit one call per input from separate threads at nearly the same time."""
    with ThreadPoolExecutor(len(inputs)) as pool:
        futures = [pool.submit(lambda x=x: streamer.submit([x])) for x in inputs]
        return [f.result() for f in futures]


@pytest.mark.parametrize("make", BACKENDS)
def test_only_the_failing_input_gets_the_exception(closing, make):
    streamer = closing(make(models.fail_on_negative))
    inputs = [1, 2, -3, 4, 5, -6, 7, 8]
    futures = submit_together(streamer, inputs)
    for x, future in zip(inputs, futures):
        if x < 0:
            with pytest.raises(ValueError, match=f"negative input {x}"):
                future.result(10)
        else:
            assert future.result(10) == [x * 2]
    # The worker survived and keeps serving.
    assert streamer.predict([10, 11]) == [20, 22]


@pytest.mark.parametrize("make", BACKENDS)
def test_a_call_that_fails_for_one_of_its_inputs_says_which(closing, make):
    """A call of many inputs fails as a whole with the error of the one that
    failed, and its future says which (``failed_input``: an index of the
    list given); a call failed otherwise (a timeout) names none."""
    streamer = closing(make(models.fail_on_negative))
    future = streamer.submit([1, 2, 3, -4, 5])
    with pytest.raises(ValueError, match="negative input -4"):
        future.result(10)
    assert future.failed_input == 3
    assert streamer.submit([1, 2]).failed_input is None


@pytest.mark.parametrize("make", BACKENDS)
def test_a_model_that_raises_system_exit_fails_its_callers_and_stops_nothing_else(closing, make):
    # On the thread backend the SystemExit itself used to reach the caller's
    # thread, where it ends a program, or a server worker it was raised in.
    streamer = closing(make(models.exit_on_negative))
    with pytest.raises(WorkerDiedError) as info:
        streamer.predict([-1])
    assert "SystemExit" in str(info.value) or "exited with code 3" in str(info.value)
    assert streamer.predict([1, 2]) == [2, 4]


def test_the_failure_is_isolated_even_inside_one_batch(closing, gate):
    """Hold the model so eight calls queue into one batch, then check that the
    batch containing a bad input still answers the other seven."""
    calls = []

    def model(batch):
        calls.append(list(batch))
        gate(["hold"] if "hold" in batch else [])
        return models.fail_on_negative([x for x in batch if x != "hold"]) + (["held"] if "hold" in batch else [])

    streamer = closing(ThreadedStreamer(model, batch_size=8, max_latency=0.05))
    first = streamer.submit(["hold"])
    assert gate.entered.wait(5)
    inputs = [1, 2, 3, -4, 5, 6, 7, 8]
    futures = [streamer.submit([x]) for x in inputs]
    gate.release()
    assert first.result(5) == ["held"]
    for x, future in zip(inputs, futures):
        if x < 0:
            with pytest.raises(ValueError):
                future.result(5)
        else:
            assert future.result(5) == [x * 2]
    assert len(calls[1]) == 8, "the eight calls should have formed one batch"


def test_process_errors_carry_the_workers_traceback(closing):
    streamer = closing(make_process(models.fail_on_negative))
    with pytest.raises(ValueError, match="negative input -1") as info:
        streamer.predict([-1])
    cause = info.value.__cause__
    assert isinstance(cause, RemoteTraceback)
    assert "fail_on_negative" in cause.tb and "ValueError: negative input -1" in cause.tb
    printed = "".join(traceback.format_exception(info.type, info.value, info.tb))
    assert "fail_on_negative" in printed, "the remote traceback should print with the error"


def test_thread_errors_keep_their_own_traceback(closing):
    streamer = closing(make_thread(models.fail_on_negative))
    with pytest.raises(ValueError) as info:
        streamer.predict([-1])
    frames = [frame.name for frame in traceback.extract_tb(info.value.__traceback__)]
    assert "fail_on_negative" in frames


@pytest.mark.parametrize("make", BACKENDS)
def test_isolation_can_be_turned_off(closing, make):
    streamer = closing(make(models.fail_on_negative, isolate_errors=False))
    with pytest.raises(ValueError):
        streamer.predict([1, -2, 3])


@pytest.mark.parametrize("make", BACKENDS)
@pytest.mark.parametrize(
    "model, message",
    [
        (models.one_short, r"returned 2 results for a batch of 3 inputs"),
        (models.returns_none, r"returned NoneType for a batch of 3 inputs"),
    ],
)
def test_a_result_of_the_wrong_length_fails_the_batch_clearly(closing, make, model, message):
    streamer = closing(make(model))
    with pytest.raises(BatchLengthError, match=message):
        streamer.predict(["a", "b", "c"])


def test_sequences_other_than_lists_are_accepted(closing):
    streamer = closing(make_thread(lambda batch: tuple(x + 1 for x in batch)))
    assert streamer.predict([1, 2, 3]) == [2, 3, 4]


def test_arrays_are_split_along_their_first_axis_and_iterators_consumed(closing):
    numpy = pytest.importorskip("numpy")
    arrays = closing(make_thread(lambda batch: numpy.array([[x, -x] for x in batch])))
    assert [row.tolist() for row in arrays.predict([1, 2, 3])] == [[1, -1], [2, -2], [3, -3]]
    iterators = closing(make_thread(lambda batch: (x * 3 for x in batch)))
    assert iterators.predict([1, 2]) == [3, 6]


@pytest.mark.parametrize(
    "output, message",
    [
        (
            {"a": 1},
            r"^predict returned dict for a batch of 3 inputs; "
            r"it must return a list with one result per input, in order$",
        ),
        ("abc", r"^predict returned str for a batch of 3 inputs; it must return a list"),
        (b"abc", r"^predict returned bytes for a batch of 3 inputs"),
        (
            7,
            r"^predict returned int, which is not a sequence; "
            r"it must return a list with one result per input \(3 here\)$",
        ),
    ],
    ids=["dict", "str", "bytes", "int"],
)
def test_an_output_that_is_not_one_result_per_input_is_named_in_the_error(closing, output, message):
    """A dict, a string or bytes have a length, but are not a result per
    input: the error names what the model returned and what it must."""
    streamer = closing(make_thread(lambda batch: output))
    with pytest.raises(BatchLengthError, match=message):
        streamer.predict(["a", "b", "c"])


def test_an_unpicklable_result_fails_only_its_item(closing):
    streamer = closing(make_process(models.unpicklable_result))
    with pytest.raises(SerializationError, match="cannot be sent back from the worker"):
        streamer.predict(["lambda"])
    assert streamer.predict(["fine"]) == ["fine"]


@pytest.mark.parametrize("backend", ["thread", "process"])
@pytest.mark.parametrize("isolate", [True, False], ids=["isolated", "not-isolated"])
def test_isolation_decides_whether_a_bad_input_fails_its_batch_mates(closing, tmp_path, backend, isolate):
    """Three callers share one batch, one of them with a bad input. Isolated,
    only that caller fails (the batch is run again in halves); not isolated,
    the model's error fails every caller of the batch."""
    (tmp_path / "hold").write_text("")
    if backend == "thread":
        model = models.GatedFailOnNegative()
        model.init_model(str(tmp_path))
        streamer = closing(ThreadedStreamer(model.predict, 8, 0.05, isolate_errors=isolate))
    else:
        streamer = closing(
            Streamer(models.GatedFailOnNegative, 8, 0.05, isolate_errors=isolate,
                     model_init_kwargs={"folder": str(tmp_path)})
        )  # fmt: skip
    held = streamer.submit([0])
    assert wait_for(lambda: list(tmp_path.glob("inside-*")), 30)
    calls = [streamer.submit([x]) for x in (1, -2, 3)]
    time.sleep(0.2)  # all three queue behind the held batch
    (tmp_path / "hold").unlink()
    assert held.result(10) == [0]
    concurrent.futures.wait(calls, 10)
    batches = [json.loads(line) for line in (tmp_path / "batches.jsonl").read_text().splitlines()]
    assert batches[1] == [1, -2, 3], f"the three callers should share one batch: {batches}"
    if isolate:
        assert calls[0].result(10) == [2] and calls[2].result(10) == [6]
        with pytest.raises(ValueError, match="negative input -2"):
            calls[1].result(10)
    else:
        for call in calls:
            with pytest.raises(ValueError, match="negative input -2"):
                call.result(10)
