"""Running one batch on the model, with the failing items found and isolated.

Shared by the thread backend (in the model thread) and the process backend
(inside each worker process), so both give the same per-item outcomes.
"""

from __future__ import annotations

from typing import Any, Callable, List, Sequence

from .batching import Outcome
from .errors import BatchLengthError

__all__ = ["run_batch"]

PredictFunction = Callable[[List[Any]], Sequence[Any]]


def run_batch(predict: PredictFunction, inputs: List[Any], isolate_errors: bool) -> List[Outcome]:
    """Call ``predict(inputs)`` and return one outcome per input.

    When the call raises and ``isolate_errors`` is on, the two halves of the
    batch are run again, recursively, so only the inputs that raise on their
    own get the exception and every other input gets its result. (A model that
    fails only on large batches, say out of memory, recovers the same way.)
    A result list of the wrong length fails the whole batch with
    :class:`BatchLengthError`: which output belongs to which input is unknown.
    """
    n = len(inputs)
    try:
        outputs = predict(inputs)
    except Exception as exc:
        if isolate_errors and n > 1:
            middle = n // 2
            return run_batch(predict, inputs[:middle], True) + run_batch(predict, inputs[middle:], True)
        return [(False, exc)] * n
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
