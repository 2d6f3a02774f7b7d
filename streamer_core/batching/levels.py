"""Priority levels: :class:`LeveledQueue`, the line of waiting inputs a
:class:`~streamer_core.batching.former.BatchFormer` is given for a model with
more than one level (``priority_levels``; :func:`waiting_queue` picks it).

A call names its level as ``priority``, 1 the highest (as Triton numbers
them), ``priority_levels`` the lowest; one that names none gets
``default_priority``, or the lowest level when that is not set, so that
turning levels on changes nothing until callers ask for more. Inside, a
level is counted from 0 (``priority - 1``).

The rule, everywhere a batch forms (the Scheduler of the thread and process
backends, a Redis worker):

- each level waits in a line of its own, in arrival order;
- *when* a batch goes is the one-level rule (:mod:`streamer_core.batching.former`),
  over every level together: ``batch_size`` inputs waiting, or the oldest
  of them held as long as the hold policy says;
- *what* it holds: the inputs of the highest level first, oldest first,
  then those of the next level, and so on, up to ``batch_size``;
- no level starves for ever when ``priority_aging`` is set: an input that
  has waited that many seconds is served as one level higher, twice that
  as two levels higher, and so on up to the highest; among inputs served
  at one level, the older goes first. So an input of level ``p`` is served
  as level 1 after ``(p - 1) * priority_aging`` seconds, and from then on
  only inputs older than it go before it.
- a worker busy with a batch is handed the next one ahead only when the
  highest level's inputs fill it (:class:`~streamer_core.batching.scheduler.Scheduler`):
  a lower batch handed ahead would hold up every higher input that comes
  meanwhile. A Redis worker, which reads its next batch ahead itself, reads
  the higher levels' requests beside it instead (:mod:`streamer_core.backends.redis.reader`);
- shaped by cost (``item_cost``, ``max_batch_cost``), a batch is led by the
  input that goes first by that rule, and its companions are chosen by
  cost among the next inputs in that order;
- the parked inputs of large calls (:meth:`~streamer_core.batching.former.BatchFormer.add_call`,
  :mod:`~streamer_core.batching.parking`)
  join their level's line in turns taken by level: the calls served at the
  highest level (aging counted) first, those of one level in turn.

Each level has its own bound on waiting inputs (``priority_max_queue``,
else ``max_queue`` for each): a full level refuses its calls, the others
take theirs.
"""

from __future__ import annotations

import time
from collections import deque
from typing import TYPE_CHECKING, Any, Callable, Deque, Iterator, List, Optional, Protocol, Sequence, TypeVar

from ..errors import QueueFullError
from ..options.config import BatchingConfig
from .queues import FifoQueue, Waiting, WaitingQueue, kept

if TYPE_CHECKING:
    from .former import BatchFormer

__all__ = ["LeveledQueue", "Leveled", "waiting_queue", "make_room"]


class Leveled(Waiting, Protocol):
    """What the leveled queue needs of an input: a level, 0 the highest."""

    level: int


L = TypeVar("L", bound=Leveled)


def waiting_queue(config: BatchingConfig) -> WaitingQueue[L]:
    """The line a former of ``config`` is given: one per level where it has
    more than one (``priority_levels``), else one in arrival order."""
    if config.priority_levels > 1:
        return LeveledQueue(config)
    return FifoQueue()


def make_room(former: BatchFormer[Any], config: BatchingConfig, level: int, n: int) -> None:
    """Raise :class:`QueueFullError` unless ``n`` more inputs fit in
    ``former``'s bound (``max_queue``; with priority levels, ``level``'s:
    ``priority_max_queue``, else ``max_queue``), given-up inputs dropped
    before it refuses."""
    if former.levels == 1:
        limit = config.max_queue
        if limit is not None and former.in_queue() + n > limit:
            former.compact()
            if former.in_queue() + n > limit:
                raise QueueFullError(
                    f"the queue holds {former.in_queue()} items and max_queue is {limit}: "
                    "retry later, add workers, or raise max_queue"
                )
        return
    limit = config.queue_limit(level)
    if limit is not None and former.in_level(level) + n > limit:
        former.compact()
        if former.in_level(level) + n > limit:
            raise QueueFullError(
                f"priority {level + 1} holds {former.in_level(level)} items and its bound is {limit}: "
                "retry later, add workers, or raise its bound (priority_max_queue or max_queue)"
            )


class LeveledQueue(WaitingQueue[L]):
    """One line per priority level, served as the module's doc says. Its
    former's owner checks each level's bound with
    :meth:`~streamer_core.batching.former.BatchFormer.in_level` before adding."""

    def __init__(self, config: BatchingConfig) -> None:
        self.levels = config.priority_levels
        self._lines: List[Deque[L]] = [deque() for _ in range(config.priority_levels)]
        #: Seconds of waiting that raise an input one level (``None``: never).
        self.aging_s = config.priority_aging
        self._count = 0  # inputs in every line (given-up ones may still be counted)
        self._live: Callable[[L], bool] = _always
        self._drop: Callable[[L], None] = _ignore

    def attach(self, live: Callable[[L], bool], drop: Callable[[L], None]) -> None:
        self._live, self._drop = live, drop

    def __len__(self) -> int:
        return self._count

    def __iter__(self) -> Iterator[L]:
        for line in self._lines:
            yield from line

    def add(self, inputs: Sequence[L]) -> None:
        lines = self._lines
        for each in inputs:
            lines[each.level].append(each)
        self._count += len(inputs)

    def put_back(self, inputs: Sequence[L]) -> None:
        lines = self._lines
        for each in reversed(inputs):
            lines[each.level].appendleft(each)
        self._count += len(inputs)

    def oldest(self) -> Optional[L]:
        """Every line's given-up head dropped; the oldest of their heads
        (whose wait says when a batch goes, whatever its level)."""
        oldest: Optional[L] = None
        for line in self._lines:
            self._drop_dead_heads(line)
            if line and (oldest is None or line[0].arrival < oldest.arrival):
                oldest = line[0]
        return oldest

    def pop(self, count: int, newest: bool = False) -> List[L]:
        """Up to ``count`` inputs in serving order: the line served next
        (its level, aging counted) gives its oldest (``newest``: its
        newest; the levels keep their order, and aging its turns)."""
        taken: List[L] = []
        now = time.monotonic()
        live = self._live
        while len(taken) < count:
            line = self._next_line(now)
            if line is None:
                break
            if not newest:
                taken.append(line.popleft())
                self._count -= 1
                continue
            while line:  # the newest live input of this line; given-up ones met are dropped
                last = line.pop()
                self._count -= 1
                if live(last):
                    taken.append(last)
                    break
                self._drop(last)
        return taken

    def give_back(self, inputs: Sequence[L], newest: bool) -> None:
        if not newest:
            self.put_back(inputs)
            return
        lines = self._lines
        for each in reversed(inputs):
            lines[each.level].append(each)
        self._count += len(inputs)

    def taken_before(self, arrival: float) -> List[L]:
        taken: List[L] = []
        for line in self._lines:
            while line and line[0].arrival < arrival:
                taken.append(line.popleft())
                self._count -= 1
        return taken

    def compact(self) -> None:
        self._lines = [deque(kept(line, self._live, self._drop)) for line in self._lines]
        self._count = sum(len(line) for line in self._lines)

    def clear(self) -> None:
        for line in self._lines:
            line.clear()
        self._count = 0

    def level_next(self) -> int:
        line = self._next_line(time.monotonic())
        return 0 if line is None else line[0].level

    def level_of(self, each: L) -> int:
        return each.level

    def in_level(self, level: int) -> int:
        return len(self._lines[level])

    def turn(self, calls: Sequence[Sequence[L]]) -> int:
        """Of the parked calls served at the highest level (their own,
        raised by aging as in :meth:`_next_line`), the first in turn; a
        lower call's inputs joining the line first would hold up the
        higher one's in every other batch."""
        aging_s, now = self.aging_s, time.monotonic()

        def served_as(index: int) -> int:
            head = calls[index][0]
            return head.level if aging_s is None else max(0, head.level - int((now - head.arrival) / aging_s))

        return min(range(len(calls)), key=lambda index: (served_as(index), index))

    def _next_line(self, now: float) -> Optional[Deque[L]]:
        """The line whose head is served next: the highest level it is
        served as (its own, raised by aging), the oldest among equals;
        ``None`` when nothing live waits."""
        aging_s = self.aging_s
        best: Optional[Deque[L]] = None
        best_level, best_arrival = 0, 0.0
        for level, line in enumerate(self._lines):
            self._drop_dead_heads(line)
            if not line:
                continue
            if aging_s is None:
                return line  # the first line with a live input: the highest level waiting
            head = line[0]
            served_as = max(0, level - int((now - head.arrival) / aging_s))
            if best is None or (served_as, head.arrival) < (best_level, best_arrival):
                best, best_level, best_arrival = line, served_as, head.arrival
        return best

    def _drop_dead_heads(self, line: Deque[L]) -> None:
        live = self._live
        while line and not live(line[0]):
            self._drop(line.popleft())
            self._count -= 1


def _always(_: Any) -> bool:
    return True


def _ignore(_: Any) -> None:
    pass
