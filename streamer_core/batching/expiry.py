"""Calls of the scheduler that end unanswered: :class:`Expiry`.

A call ends without its answer when its deadline passes, wherever its
inputs are (queued or on a worker); when, as a batch forms, its deadline
comes sooner than the fastest of the model's latest batches could end (see
:mod:`streamer_core.batching.scheduler`); or when, under overload, it waited
too long in a queue that stands (:mod:`streamer_core.batching.overload`). The
first is found by the dispatcher's look at the deadlines, the others by the
scheduler's :class:`~streamer_core.batching.former.BatchFormer` as it meets
the call's inputs, which it asks :meth:`Expiry.live` and tells
:meth:`Expiry.dropped` or :meth:`Expiry.shed`.
"""

from __future__ import annotations

import time
from typing import Callable, Iterable, Optional, Tuple

from ..errors import OverloadedError, StreamerTimeoutError
from ..options.config import BatchingConfig
from ..telemetry.stats import ModelStats
from .calls import Item, Task
from .deadlines import Deadlines
from .hold import HoldPolicy

__all__ = ["Expiry"]


class Expiry:
    """The deadlines of one scheduler's calls, and what ends one unanswered.
    ``shed_late``: drop inputs no batch forming now could answer in time
    (off where batches here are not the model's: sends to a broker).
    """

    def __init__(self, config: BatchingConfig, stats: Optional[ModelStats], shed_late: bool) -> None:
        self.deadlines: Deadlines[Task] = Deadlines(config.timeout)
        # What a queue that stands is (overload_after, overload_wait), told to a call refused then.
        self._after_s, self._wait_s = config.overload_after, config.overload_wait
        self._stats = stats
        self._shed_late = shed_late
        # While a batch forms: inputs due before this are late (see forming).
        self._late_before = float("-inf")

    def live(self, item: Item) -> bool:
        """Whether an item's call still waits for it, and could be answered
        in time by a batch forming now (the former drops the rest)."""
        future = item.task.future
        return future is not None and future._state == "PENDING" and future._deadline >= self._late_before

    def dropped(self, item: Item) -> None:
        """The former dropped ``item`` unrun: its call had ended, or would
        end before a batch could answer it (then it fails now)."""
        task = item.task
        if task.live():
            answered = task.size - task.remaining
            unrun = (
                "it was not run"
                if task.size == 1
                else f"its inputs still queued were not run ({answered} of its {task.size} had been answered)"
            )
            task.fail(StreamerTimeoutError.unrun(task.timeout, unrun))
        if self._stats is not None:
            self._stats.dropped(task.why())

    def shed(self, item: Item) -> None:
        """Under overload the former refused ``item``, which waited too long
        in a queue that stands (:mod:`streamer_core.batching.overload`): its call
        fails with :class:`OverloadedError` (503, ``Retry-After``)."""
        task = item.task
        waited = time.monotonic() - item.arrival
        task.fail(
            OverloadedError(
                f"the model is overloaded: this call waited {waited:.2g}s in a queue that has not emptied for "
                f"{self._after_s:.2g}s or more, longer than the {self._wait_s:.2g}s (overload_wait) an input "
                "waits then; the newest calls are served first: retry"
            )
        )
        if self._stats is not None:
            self._stats.dropped(task.why())

    def forming(self, now: float, held: int, policy: HoldPolicy) -> None:
        """A batch forms now for a worker holding ``held`` batches: inputs
        due before the fastest recent batch (``policy``'s; one per batch
        held and this one) could end are late."""
        fastest = policy.fastest(now) if self._shed_late else None
        self._late_before = float("-inf") if fastest is None else now + (held + 1) * fastest

    def formed(self) -> None:
        """The batch formed: no input is late until the next forms."""
        self._late_before = float("-inf")

    def expire(self, now: float) -> Tuple[int, int, float]:
        """Fail every call past its deadline; return how many calls and
        inputs that ended, and the next deadline."""
        expired = calls = 0
        for task in self.deadlines.pop_expired(now):
            if task.future is not None:
                expired += task.size
                calls += 1
                task.fail(StreamerTimeoutError(f"the call did not finish within its timeout of {task.timeout:.3g}s"))
        return calls, expired, self.deadlines.soonest()

    def fail_all(self, make_error: Callable[[], BaseException], queued: Iterable[Item]) -> None:
        """Fail every call with ``make_error()``: those whose deadlines are
        kept and those of the ``queued`` items; forget the deadlines."""
        for task in self.deadlines.tasks():
            if task.future is not None:
                task.fail(make_error())
        for item in queued:
            if item.task.future is not None:
                item.task.fail(make_error())
        self.deadlines.clear()
