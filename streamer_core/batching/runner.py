"""Running one batch on the model, with the failing items found and isolated.

Shared by the thread backend (in the model thread) and the process backend
(inside each worker process), so both give the same per-item outcomes.
"""

from __future__ import annotations

from typing import Any, Callable, List, NamedTuple, Sequence, Tuple

from ..errors import BatchLengthError
from ..options.checks import OomErrors
from .calls import Outcome
from .oom import free_cached_memory, is_out_of_memory

__all__ = ["run_batch", "BatchRun"]

PredictFunction = Callable[[List[Any]], Sequence[Any]]


class BatchRun(NamedTuple):
    """What running one batch gave: an outcome per input, whether the model
    ran out of memory on it (or on a part), the spans ``[start, end)`` of
    the inputs whose model call returned, and how many times a batch or a
    part of it was split in halves because it ran out of memory."""

    outcomes: List[Outcome]
    out_of_memory: bool
    ran: List[Tuple[int, int]]
    oom_splits: int


def run_batch(
    predict: PredictFunction, inputs: List[Any], isolate_errors: bool, oom_errors: OomErrors = None
) -> BatchRun:
    """Call ``predict(inputs)`` and return one outcome per input.

    When the call raises and ``isolate_errors`` is on, the two halves of the
    batch are run again, recursively, so only the inputs that raise on their
    own get the exception and every other input gets its result. An
    out-of-memory error (``oom_errors``, see :mod:`streamer_core.batching.oom`) is
    split the same way whether ``isolate_errors`` is on or not, after
    freeing torch's cached memory: only an input too big alone fails.
    A result list of the wrong length fails the whole batch with
    :class:`BatchLengthError`: which output belongs to which input is unknown.
    """
    ran: List[Tuple[int, int]] = []
    counts = [0, 0]  # out-of-memory errors, and the splits they caused
    outcomes = _run(predict, inputs, 0, isolate_errors, oom_errors, ran, counts)
    return BatchRun(outcomes, counts[0] > 0, ran, counts[1])


def _run(
    predict: PredictFunction,
    inputs: List[Any],
    start: int,
    isolate: bool,
    oom_errors: OomErrors,
    ran: List[Tuple[int, int]],
    counts: List[int],
) -> List[Outcome]:
    n = len(inputs)
    try:
        outputs = predict(inputs)
    except Exception as exc:
        out_of_memory = is_out_of_memory(exc, oom_errors)
        if out_of_memory:
            counts[0] += 1
            free_cached_memory()
        if (isolate or out_of_memory) and n > 1:
            counts[1] += out_of_memory
            middle = n // 2
            return _run(predict, inputs[:middle], start, isolate, oom_errors, ran, counts) + _run(
                predict, inputs[middle:], start + middle, isolate, oom_errors, ran, counts
            )
        return [(False, exc)] * n
    ran.append((start, start + n))
    try:
        results = _as_list(outputs, n)
    except BatchLengthError as exc:
        return [(False, exc)] * n
    return [(True, value) for value in results]


def _as_list(outputs: Any, n: int) -> List[Any]:
    """Outputs as a list: lists as they are, any other sized sequence (tuple,
    numpy array, tensor) split along its first axis, an iterator consumed."""
    if outputs is None or isinstance(outputs, (str, bytes, dict)):
        raise BatchLengthError(
            f"predict returned {type(outputs).__name__} for a batch of {n} inputs; "
            "it must return a list with one result per input, in order"
        )
    if isinstance(outputs, list):
        results = outputs
    elif hasattr(outputs, "__len__") and hasattr(outputs, "__getitem__"):
        results = [outputs[i] for i in range(len(outputs))]
    else:
        try:
            results = list(outputs)
        except TypeError:
            raise BatchLengthError(
                f"predict returned {type(outputs).__name__}, which is not a sequence; "
                f"it must return a list with one result per input ({n} here)"
            ) from None
    if len(results) != n:
        raise BatchLengthError(
            f"predict returned {len(results)} results for a batch of {n} inputs; "
            "it must return exactly one result per input, in order"
        )
    return results
