"""Priority levels: :class:`LeveledFormer`, the batch former of a model
with more than one level (``priority_levels``).

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
- the parked inputs of large calls (:meth:`~streamer_core.batching.former.BatchFormer.add_call`)
  join their level's line in turns taken by level: the calls served at the
  highest level (aging counted) first, those of one level in turn.

Each level has its own bound on waiting inputs (``priority_max_queue``,
else ``max_queue`` for each): a full level refuses its calls, the others
take theirs.
"""

from __future__ import annotations

import math
import time
from collections import deque
from typing import Callable, Deque, Iterator, List, Optional, Protocol, Sequence, TypeVar, overload

from streamer_core.options.config import BatchingConfig
from streamer_core.batching.former import SHAPING_WINDOW, BatchFormer, Waiting

__all__ = ["LeveledFormer", "Leveled"]


class Leveled(Waiting, Protocol):
    """What the leveled former needs of an input: a level, 0 the highest."""

    level: int


L = TypeVar("L", bound=Leveled)


class LeveledFormer(BatchFormer[L]):
    """A :class:`~streamer_core.batching.former.BatchFormer` with one line per
    priority level (see the module's doc). Its owner checks each level's
    bound with :meth:`in_level` before :meth:`add`."""

    def __init__(
        self,
        config: BatchingConfig,
        costed: bool,
        live: Optional[Callable[[L], bool]] = None,
        dropped: Optional[Callable[[L], None]] = None,
        shed: Optional[Callable[[L], None]] = None,
    ) -> None:
        super().__init__(config, costed, live, dropped, shed)
        self._lines: List[Deque[L]] = [deque() for _ in range(config.priority_levels)]
        #: Seconds of waiting that raise an input one level (``None``: never).
        self.aging_s = config.priority_aging
        self._count = 0  # inputs in every line (given-up ones may still be counted)

    # -- what waits --------------------------------------------------------------

    def add(self, inputs: Sequence[L]) -> None:
        for each in inputs:
            self._lines[each.level].append(each)
            self._bound_top = max(self._bound_top, each.cost)
            self._bound_sum += each.cost
        self._count += len(inputs)

    def put_back(self, inputs: Sequence[L]) -> None:
        for each in reversed(inputs):
            self._lines[each.level].appendleft(each)
        self._count += len(inputs)
        self._rebound()

    def in_queue(self) -> int:
        return self._count + self._parked_count

    def in_level(self, level: int) -> int:
        """Inputs waiting at ``level``, parked ones included (given-up ones may still be counted)."""
        return len(self._lines[level]) + sum(len(call) for call in self._parked if call[0].level == level)

    def levels_waiting(self) -> List[int]:
        """Inputs waiting at each level, the highest first."""
        return [self.in_level(level) for level in range(len(self._lines))]

    def __iter__(self) -> Iterator[L]:
        yield from self._alone
        for line in self._lines:
            yield from line
        for call in self._parked:
            yield from call

    def clear(self) -> None:
        for line in self._lines:
            line.clear()
        self._count = 0
        super().clear()

    def compact(self) -> None:
        self._lines = [deque(self._kept(line)) for line in self._lines]
        self._count = sum(len(line) for line in self._lines)
        super().compact()

    # -- when a batch goes ---------------------------------------------------------

    def over_budget(self) -> bool:
        shaper = self.shaper
        budget = shaper.budget()
        if math.isinf(budget):
            return False
        bound = self._count * self._bound_top if shaper.rule == "max" else self._bound_sum
        if bound <= budget:
            return False
        live = self._live
        return shaper.over_budget([each.cost for line in self._lines for each in line if live(each)])

    def _skip_given_up(self) -> Sequence[L]:
        """Every line's given-up head dropped; what waits, as the one-level
        rule looks at it: its count, and the oldest input first."""
        oldest: Optional[L] = None
        for line in self._lines:
            self._drop_dead_heads(line)
            if line and (oldest is None or line[0].arrival < oldest.arrival):
                oldest = line[0]
        return _Waiting(self._count, oldest)

    # -- what a batch holds --------------------------------------------------------

    def _level_next(self) -> int:
        line = self._next_line(time.monotonic())
        return 0 if line is None else line[0].level

    def _pop(self, size: int, newest: bool = False) -> List[L]:
        """Up to ``size`` inputs in serving order: the line served next
        (its level, aging counted) gives its oldest (``newest``: its
        newest; the levels keep their order, and aging its turns)."""
        batch: List[L] = []
        now = time.monotonic()
        live = self._live
        while len(batch) < size:
            line = self._next_line(now)
            if line is None:
                break
            if not newest:
                batch.append(line.popleft())
                self._count -= 1
                continue
            while line:  # the newest live input of this line; given-up ones met are dropped
                last = line.pop()
                self._count -= 1
                if live(last):
                    batch.append(last)
                    break
                self._drop(last)
        return batch

    def _pop_shaped(self, size: int, newest: bool = False) -> List[L]:
        """Shaped by cost among the next :data:`~streamer_core.batching.former.SHAPING_WINDOW`
        batches' worth of inputs in serving order, led by the first; the
        rest go back to their lines where they were, in their order."""
        window = self._pop(SHAPING_WINDOW * self.size, newest)
        taken = self.shaper.shape([each.cost for each in window])[:size]
        chosen = set(taken)
        self._give_back([each for index, each in enumerate(window) if index not in chosen], newest)
        return [window[index] for index in taken]

    def _give_back(self, inputs: List[L], newest: bool) -> None:
        if not newest:
            self.put_back(inputs)
            return
        for each in reversed(inputs):
            self._lines[each.level].append(each)
        self._count += len(inputs)
        self._rebound()

    def _shed_waited(self, oldest_kept: float) -> None:
        live = self._live
        for line in self._lines:
            while line and line[0].arrival < oldest_kept:
                first = line.popleft()
                self._count -= 1
                if live(first):
                    self._shed(first)
                else:
                    self._drop(first)

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

    def _next_parked(self) -> Deque[L]:
        """The parked call whose turn it is: of those served at the highest
        level (their own, raised by aging as in :meth:`_next_line`), the first
        in turn; a lower call's inputs joining the line first would hold up
        the higher one's in every other batch."""
        parked, aging_s, now = self._parked, self.aging_s, time.monotonic()

        def served_as(index: int) -> int:
            head = parked[index][0]
            return head.level if aging_s is None else max(0, head.level - int((now - head.arrival) / aging_s))

        turn = min(range(len(parked)), key=lambda index: (served_as(index), index))
        call = parked[turn]
        del parked[turn]
        return call

    def _drop_dead_heads(self, line: Deque[L]) -> None:
        live = self._live
        while line and not live(line[0]):
            self._drop(line.popleft())
            self._count -= 1

    def _rebound(self) -> None:
        costs = [each.cost for line in self._lines for each in line]
        self._bound_top, self._bound_sum = max(costs, default=0.0), float(sum(costs))


class _Waiting(Sequence[L]):
    """What waits at every level, as the one-level rule of
    :meth:`BatchFormer.decide` reads it: its count, and its oldest input at 0."""

    def __init__(self, count: int, oldest: Optional[L]) -> None:
        self._n = count if oldest is not None else 0
        self._oldest = oldest

    def __len__(self) -> int:
        return self._n

    @overload
    def __getitem__(self, index: int) -> L: ...
    @overload
    def __getitem__(self, index: slice) -> Sequence[L]: ...
    def __getitem__(self, index: object) -> object:
        if index != 0 or self._oldest is None:
            raise IndexError("only the oldest input waiting is told")
        return self._oldest
