"""The calls of this process as the scheduler holds them: a :class:`Task`
per call (``submit(batch)``), with its :class:`BatchFuture` and the results
gathered so far, and an :class:`Item` per input, which is what waits in the
scheduler's former and what a backend hands its worker. :func:`deliver`
gives a batch's items their outcomes and wakes their callers once all are
in place; :func:`live_items` is a backend's last look before its model runs
a batch.
"""

from __future__ import annotations

from typing import Any, List, Optional, Sequence, Tuple

from ..errors import WorkerDiedError
from ..future import BatchFuture, settle
from ..telemetry.stats import ModelStats
from ..telemetry.tracing import CallTrace

__all__ = ["Task", "Item", "Outcome", "items_of", "crashed", "deliver", "live_items", "unanswered"]

#: A per-item result: ``(True, value)`` or ``(False, exception)``.
Outcome = Tuple[bool, Any]


class Task:
    """One ``submit()`` call: its future and the results gathered so far.

    Results are written by one delivery thread per backend; failures
    (timeouts, close) may come from other threads, which is why a completion
    may find the future done already and must not fail then (:func:`settle`,
    ``_set_quietly``).
    """

    __slots__ = ("future", "results", "remaining", "size", "timeout", "trace", "gone")

    def __init__(self, future: BatchFuture, size: int, timeout: float, trace: Optional[CallTrace] = None) -> None:
        self.future: Optional[BatchFuture] = future
        self.results: Optional[List[Any]] = [None] * size
        self.remaining = size
        self.size = size
        self.timeout = timeout
        #: The span the call was submitted in, when its streamer traces (see :mod:`.tracing`).
        self.trace = trace
        self.gone = "cancelled"  # why it ended, once its future is let go (see why)

    def live(self) -> bool:
        future = self.future
        return future is not None and future._state == "PENDING"

    def why(self) -> str:
        """Why the call ended unanswered (one of ``stats.DROP_REASONS``),
        asked of an input dropped for it."""
        future = self.future
        return self.gone if future is None else future._why

    def fail(self, exc: BaseException, index: Optional[int] = None) -> bool:
        """Fail the call with ``exc``; ``index``: the input it is the error of
        (:attr:`BatchFuture.failed_input`), where one input failed alone."""
        future = self.future
        if future is None:
            return False
        self.future = self.results = None  # drop references: nothing stays in memory for it
        if index is not None:
            future.failed_input = index  # before it completes: a woken caller reads it
        settled = settle(future, exc=exc)
        self.gone = future._why  # set by this failure, or by whatever ended the call first
        return settled

    def set_outcome(self, index: int, ok: bool, value: Any) -> Optional[BatchFuture]:
        """Record one item's outcome; return the future if this completed it
        with its results (its waiter still to be woken), else ``None``."""
        future, results = self.future, self.results
        if future is None or results is None or future._state != "PENDING":
            return None
        if not ok:
            self.fail(value, index)
            return None
        results[index] = value
        self.remaining -= 1
        if self.remaining == 0:
            self.future = self.results = None
            if future._set_quietly(results):
                return future
        return None


class Item:
    """One input of a task, queued for the model. ``value`` is what the backend
    sends to its worker (the input itself, or its pickle)."""

    __slots__ = ("task", "index", "value", "arrival", "crashes", "cost", "level")

    def __init__(self, task: Task, index: int, value: Any, arrival: float, cost: float = 1.0, level: int = 0) -> None:
        self.task = task
        self.index = index
        self.value = value
        self.arrival = arrival
        self.crashes = 0
        self.cost = cost
        #: Its call's priority level, 0 the highest (see :mod:`streamer_core.batching.levels`).
        self.level = level


def items_of(
    task: Task, values: Sequence[Any], now: float, costs: Optional[Sequence[float]] = None, level: int = 0
) -> Sequence[Item]:
    """The items of ``task``, one per input of ``values`` (already encoded
    by the backend), arrived at ``now``, each of its cost (1 without
    ``costs``) at priority ``level``."""
    n = len(values)
    if level:
        ones = [1.0] * n if costs is None else costs
        return [Item(task, i, v, now, c, level) for i, (v, c) in enumerate(zip(values, ones))]
    if n == 1:  # most calls: one input
        return (Item(task, 0, values[0], now) if costs is None else Item(task, 0, values[0], now, costs[0]),)
    if costs is not None:
        return [Item(task, i, v, now, c) for i, (v, c) in enumerate(zip(values, costs))]
    return [Item(task, i, v, now) for i, v in enumerate(values)]


def crashed(batches: Sequence[Sequence[Item]], reason: str, max_crashes: int) -> List[Item]:
    """The items of ``batches``, whose worker died (``reason``), to run
    again alone: each counts one more crash, and one now in
    ``max_crashes`` crashed batches fails its call with
    :class:`WorkerDiedError` instead (it may be what kills the worker)."""
    again: List[Item] = []
    for items in batches:
        for item in items:
            item.crashes += 1
            if item.crashes >= max_crashes:
                item.task.fail(
                    WorkerDiedError(
                        f"{reason}; this input was in {item.crashes} batches whose worker died, "
                        "so it is not retried (it may be what kills the worker)"
                    )
                )
            elif item.task.live():
                again.append(item)
    return again


def unanswered(item: Item) -> int:
    """How many inputs of ``item``'s call have no answer yet."""
    return item.task.remaining


def live_items(items: Sequence[Item], stats: Optional[ModelStats]) -> List[Item]:
    """The items of a batch whose calls still wait for them; the others
    are dropped unrun, counted by why (a backend's last look before its
    model runs the batch)."""
    kept = [item for item in items if item.task.live()]
    if len(kept) < len(items) and stats is not None:
        for item in items:
            if not item.task.live():
                stats.dropped(item.task.why())
    return kept


def deliver(items: Sequence[Item], outcomes: Sequence[Outcome]) -> None:
    """Hand each item its outcome (result or exception); wake the callers
    only once every result of the batch is in place."""
    completed = []
    for item, (ok, value) in zip(items, outcomes):
        future = item.task.set_outcome(item.index, ok, value)
        if future is not None:
            completed.append(future)
    if completed:
        stats = completed[0]._stats  # a batch's calls are all of one streamer
        if stats is not None:  # counted before the callers wake to read the numbers
            if stats.leveled:  # each at its priority level
                for future in completed:
                    future._stats.succeeded(1)  # type: ignore[union-attr]  # of one streamer: all set
            else:
                stats.succeeded(len(completed))
    for future in completed:
        future._wake()
