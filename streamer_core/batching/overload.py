"""Overload without deadlines: when the queue stands, the newest inputs
are served first, and those that have waited too long are refused.

Under an overload whose callers give up and ask again (a retry storm),
first come first served runs nothing but the oldest inputs, whose callers
are about to leave or have left: the model's time goes to answers nobody
reads, and a fresh caller waits behind them and leaves too. The cure is
the field's (Facebook's adaptive LIFO and controlled delay, "Fail at
Scale", ACM Queue 2015; CoDel, Nichols and Jacobson 2012): notice that the
queue *stands* (it has not emptied for a while: not a burst it absorbs,
more work than the model serves), and then serve the newest inputs first,
whose callers still wait, and refuse, at once, those that have waited past
a short bound, so that their callers hear it and back off rather than wait
for an answer that will not come in time. When the queue empties again,
first come first served returns.

Where a batch forms (:class:`~streamer_core.batching.former.BatchFormer`):

- the queue stands once every batch taken for ``overload_after`` seconds
  has left inputs behind (a batch that takes everything waiting ends it);
- it is overloaded while it stands and callers are seen leaving it: inputs
  dropped unrun because their caller gave up (a client that went away, a
  call cancelled), or calls whose deadline passed wherever their inputs
  were (queued, running, sent to a broker), at least
  :data:`LEAVING_MOST` of them in the last :data:`LEAVING_WINDOW_S`
  seconds. A queue that stands with patient callers (a closed loop of
  more clients than a batch holds, each waiting its turn) is served first
  come first served: newest first would serve the same few callers over
  and over and leave the others to wait out their timeouts;
- while it is overloaded, a batch holds the newest inputs waiting (within
  each priority level: the levels keep their order, and aging its turns),
  and an input that has waited longer than ``overload_wait`` seconds, or
  twice the model's recent batch time if that is longer, is taken out
  unrun, its call refused with :class:`~streamer_core.errors.OverloadedError`
  (503 with ``Retry-After``), counted ``expired`` in
  ``streamer_dropped_total``.

Only where the owner can answer a refused call (the in-process scheduler;
a Redis web process, which holds back what its workers cannot take: see
:mod:`streamer_core.backends.redis.client`). ``overload_after=None`` turns
it off. A caller whose deadline the streamer knows (a call's ``timeout``, a
request's ``X-Request-Timeout``) is served by the deadline rule as well:
an input that could not be answered in time is not run.
"""

from __future__ import annotations

import time
from collections import deque
from typing import Callable, Deque, Optional, TypeVar

__all__ = ["StandingQueue", "LEAVING_MOST", "LEAVING_WINDOW_S"]

T = TypeVar("T")

#: Callers seen leaving within :data:`LEAVING_WINDOW_S` that make a standing queue an overload.
LEAVING_MOST = 2
#: Seconds over which callers leaving are counted.
LEAVING_WINDOW_S = 2.0


class StandingQueue:
    """Whether the queue of one former is overloaded (see the module's
    doc): told after each batch is taken whether it left inputs behind,
    and of each input dropped because its caller left."""

    __slots__ = ("after_s", "wait_s", "_since", "_left")

    def __init__(self, after_s: Optional[float], wait_s: float) -> None:
        #: Seconds of batches leaving inputs behind before the queue stands (``None``: never).
        self.after_s = after_s
        #: Under overload, the longest an input waits before its call is refused (at least twice a batch's time).
        self.wait_s = wait_s
        self._since: Optional[float] = None  # the first batch of a run that left inputs behind
        self._left: Deque[float] = deque(maxlen=LEAVING_MOST)  # when the latest callers left

    @property
    def on(self) -> bool:
        """Whether the queue may ever be found overloaded."""
        return self.after_s is not None

    def overloaded(self, now: float) -> bool:
        """Whether the queue stands now, and callers leave it."""
        after_s, left = self.after_s, self._left
        return (
            after_s is not None
            and self._since is not None
            and now - self._since >= after_s
            and len(left) == LEAVING_MOST
            and now - left[0] <= LEAVING_WINDOW_S
        )

    def taken(self, left_behind: bool, now: float) -> None:
        """A batch was taken at ``now``, leaving inputs behind or not."""
        if not left_behind:
            self._since = None
        elif self._since is None:
            self._since = now

    def caller_left(self, now: float) -> None:
        """An input was dropped unrun at ``now``: its caller had given up."""
        self._left.append(now)

    def callers_left(self, count: int, now: float) -> None:
        """``count`` calls ended unanswered at ``now``, their deadline past."""
        for _ in range(min(count, LEAVING_MOST)):
            self._left.append(now)

    def counting(self, told: Callable[[T], None]) -> Callable[[T], None]:
        """``told``, each input told of also counted as a caller seen leaving
        (:meth:`caller_left`): what a former tells of the inputs it drops."""
        left = self.caller_left

        def dropped(each: T) -> None:
            left(time.monotonic())
            told(each)

        return dropped

    def oldest_kept(self, now: float, batch_s: Optional[float]) -> float:
        """The earliest arrival an input may have and still be served while
        the queue is overloaded: ``overload_wait`` ago, or twice the model's
        recent batch time ``batch_s`` ago where that is longer."""
        wait_s = self.wait_s if batch_s is None else max(self.wait_s, 2 * batch_s)
        return now - wait_s
