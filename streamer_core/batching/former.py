"""Where batches form: :class:`BatchFormer`, the inputs waiting for the
model and the rule that says when a batch goes and what it holds.

One former serves wherever a batch forms: the in-process
:class:`~streamer_core.batching.scheduler.Scheduler` (thread and process backends),
which feeds it the calls of this process, and the Redis worker, which feeds
it the requests it reads from the stream. So a batch is formed by one rule
everywhere:

- inputs wait in line (:mod:`streamer_core.batching.queues`): in arrival
  order, or one line per priority level (:mod:`streamer_core.batching.levels`),
  the queue the former is given; an input that must run alone (one of a
  batch whose worker died, or taken over from a dead Redis worker) goes
  first, by itself;
- a call of more inputs than a batch holds (:meth:`BatchFormer.add_call`)
  does not line up all at once: one batch's worth of it waits in line
  (:data:`SHAPED_TURN` batches' worth when shaped by cost), the rest is
  parked (:mod:`streamer_core.batching.parking`), and after each batch taken as many parked inputs as it held
  join the back of the line, the parked calls taking turns. So a call of
  2,048 inputs holds up the calls that come after it by a batch (two
  shaped), not by the 32 it needs, and two such calls share the model.
  Where batches are sent on rather than run (a Redis web process, whose
  batches leave as soon as they are taken), :meth:`BatchFormer.gate_parked`
  also holds a call's parked inputs while too many of its others are out
  unanswered, so that they do not all reach the broker's queue at once;
- a batch goes at once when it is as full as it can be (``batch_size``
  inputs, or more than one batch's budget of cost waiting), else when the
  hold policy (:mod:`streamer_core.batching.hold`) stops waiting for companions;
- what it holds: the oldest inputs, or, shaped by cost
  (:mod:`streamer_core.batching.shaping`), the oldest and those closest to it in
  cost within the budget;
- under overload (:mod:`streamer_core.batching.overload`), where the owner can
  refuse a call (``shed``): once every batch for ``overload_after`` seconds
  has left inputs behind while callers leave the queue unanswered, the
  newest inputs instead, and those that have waited too long are taken
  out and their calls refused; when a batch leaves nothing behind, the
  oldest first again.

The former holds no lock: its owner calls it under its own. An input is
anything with a ``cost`` and an ``arrival`` (``time.monotonic()``); the
owner says which inputs are still wanted (``live``), and given-up ones are
dropped as they are met, each told to the owner (``dropped``) to be counted.
"""

from __future__ import annotations

import math
import time
from collections import deque
from typing import Any, Callable, Deque, Generic, Iterator, List, Optional, Sequence, Tuple, TypeVar

from ..options.config import BatchingConfig
from .hold import HoldPolicy
from .overload import StandingQueue
from .parking import ParkedCalls
from .queues import FifoQueue, Waiting, WaitingQueue, kept
from .shaping import CostBound, CostShaper, take_shaped

__all__ = ["BatchFormer", "Waiting", "SHAPING_WINDOW", "SHAPED_TURN", "GATED_RECHECK_S"]

#: A batch shaped by cost is chosen among the next this many batches' worth
#: of waiting inputs: enough to find like companions, few enough to sort each time.
SHAPING_WINDOW = 8

#: Shaped by cost, a large call waits in line this many batches' worth at a
#: time: the shaping chooses among them. A call of 2,048 texts of mixed
#: lengths (5 to 256 tokens) ran 14% more tokens than it held in padding
#: with one batch's worth in line, 9% with two, 3% with eight (the whole
#: window); a query after the call waits for them.
SHAPED_TURN = 2

#: While parked inputs are held at their call's gate (:meth:`BatchFormer.gate_parked`)
#: and nothing else waits, the owner looks again after at most this many
#: seconds, even if no answer told it to: a wake-up missed costs this, never a hang.
GATED_RECHECK_S = 0.05

T = TypeVar("T", bound=Waiting)


class BatchFormer(Generic[T]):
    """The inputs waiting for the model, and when and how they become a
    batch (see the module's doc). ``costed``: the inputs carry costs of
    their own (an ``item_cost``, or costs sent by the web side), so a budget
    shapes batches; without, each costs 1 and only a cap learned from
    running out of memory does. ``live(input)``: whether its caller still
    wants it (default: always); ``dropped(input)``: told of each input
    taken out unrun because it is not live; ``shed(input)``: told of each
    live input taken out unrun under overload, to refuse its call (without
    it, the queue is served in arrival order whatever its length).
    ``queue``: the line inputs wait in, this former's alone (default: one
    in arrival order; :func:`~streamer_core.batching.levels.waiting_queue`
    picks one for a config)."""

    def __init__(
        self,
        config: BatchingConfig,
        costed: bool,
        live: Optional[Callable[[T], bool]] = None,
        dropped: Optional[Callable[[T], None]] = None,
        shed: Optional[Callable[[T], None]] = None,
        queue: Optional[WaitingQueue[T]] = None,
    ) -> None:
        self.size = config.batch_size
        #: When a batch that is not full goes: answered callers are awaited, within max_latency.
        self.policy = HoldPolicy(config.max_latency)
        self.shaper = CostShaper(config, costed=costed)
        #: Whether batches are shaped by cost now: a budget, or a cap learned from running out of memory.
        self.shaped = self.shaper.active
        self._live: Callable[[T], bool] = live if live is not None else _always
        #: Whether the queue is overloaded (serve the newest first, refuse the longest waiting).
        self.standing = StandingQueue(config.overload_after if shed is not None else None, config.overload_wait)
        told: Callable[[T], None] = dropped if dropped is not None else _ignore
        if self.standing.on:
            told = self.standing.counting(told)
        self._drop: Callable[[T], None] = told
        self._shed: Callable[[T], None] = shed if shed is not None else _ignore
        # Where batches leave as soon as they are taken (hold_back): how
        # many more inputs of a level may go now (None: no bound).
        self._room: Optional[Callable[[int], int]] = None
        self._queue: WaitingQueue[T] = queue if queue is not None else FifoQueue()
        self._queue.attach(self._live, self._drop)
        self._alone: Deque[T] = deque()  # inputs to run one at a time, first
        # The inputs of large calls not yet in line (see add_call).
        self._parked: ParkedCalls[T] = ParkedCalls(self._live, self._drop, self._queue.turn)
        self._dead = 0  # inputs in the queue given up, about: triggers a compaction
        self._bound = CostBound()  # at most what the inputs in line cost (see over_budget)

    # -- what waits --------------------------------------------------------------

    def add(self, inputs: Sequence[T]) -> None:
        """Queue ``inputs`` behind those waiting."""
        self._queue.add(inputs)
        if len(inputs) == 1:  # the common case, without a list
            self._bound.add_one(inputs[0].cost)
        else:
            self._bound.add([each.cost for each in inputs])

    def add_call(self, inputs: Sequence[T]) -> None:
        """Queue one call's ``inputs``: up to a batch's worth behind those
        waiting, the rest parked to join the line a batch's worth at a time
        (see the module's doc); gated (:meth:`gate_parked`), no more than
        may be out."""
        self.add(self._parked.park(inputs, self._turn()))

    def gate_parked(self, out_limit: Callable[[], int], unanswered: Callable[[T], int]) -> None:
        """Bring a large call's parked inputs into line only while fewer than
        ``out_limit()`` of its inputs are out: in line, or taken and not
        answered yet (``unanswered(input)``: how many inputs of its call
        are not answered yet, parked ones included). For an owner whose
        batches leave as soon as they are taken (a Redis web process sends
        them to the broker, whose workers read in order): the rest of the
        call waits here, its turns kept, and the owner calls :meth:`decide`
        again as answers come. ``out_limit`` is called under the owner's
        lock: it must be cheap and take no lock."""
        self._parked.gate(out_limit, unanswered)

    def hold_back(self, room: Callable[[int], int]) -> None:
        """Take no more than ``room(level)`` inputs at a time, and none
        while it is 0, ``level`` the priority level served next (0 where
        there is one): for an owner whose batches leave as soon as they
        are taken (a Redis web process), so that what its workers cannot
        take in time waits here, where an overload's rule serves it
        (:mod:`streamer_core.batching.overload`), not in the broker's queue. Room by
        level keeps a higher level's input from waiting behind a lower
        level's that are out. The owner calls :meth:`decide` again as
        answers make room. ``room`` is called under the owner's lock:
        cheap, no lock of its own but leaf ones."""
        self._room = room

    @property
    def gated(self) -> bool:
        """Whether inputs wait that a gate may hold (see :meth:`gate_parked`, :meth:`hold_back`)."""
        parked = self._parked
        return (parked.out_limit is not None and bool(parked)) or (self._room is not None and self.in_queue() > 0)

    def add_alone(self, inputs: Sequence[T]) -> None:
        """Queue ``inputs`` to run one by one, before the others."""
        self._alone.extend(inputs)

    def put_back(self, inputs: Sequence[T]) -> None:
        """Queue ``inputs`` again at the head, in their order (a batch that
        could not be handed out, or that a dead worker never started)."""
        self._queue.put_back(inputs)
        self._rebound()

    def in_queue(self) -> int:
        """Inputs waiting in line or parked (given-up ones may still be
        counted), those waiting to run alone not included: what a bound
        on the queue counts."""
        return len(self._queue) + self._parked.count

    @property
    def levels(self) -> int:
        """How many priority levels its queue serves (1: one line)."""
        return self._queue.levels

    def in_level(self, level: int) -> int:
        """Inputs waiting at ``level``, parked ones included (given-up ones
        may still be counted), those waiting to run alone not included."""
        return self._queue.in_level(level) + self._parked.in_level(level, self._queue.level_of)

    def levels_waiting(self) -> List[int]:
        """Inputs waiting at each level, the highest first."""
        return [self.in_level(level) for level in range(self.levels)]

    def __len__(self) -> int:
        """Every input waiting, alone and parked ones included (given-up ones may still be counted)."""
        return self.in_queue() + len(self._alone)

    def __iter__(self) -> Iterator[T]:
        yield from self._alone
        yield from self._queue
        yield from self._parked

    def clear(self) -> None:
        self._queue.clear()
        self._alone.clear()
        self._parked.clear()
        self._dead = 0
        self._rebound()

    def given_up(self, count: int) -> None:
        """``count`` queued inputs were given up by their callers: once they
        are more than half of the queue, drop them all."""
        self._dead += count
        if self._dead * 2 > self.in_queue():
            self.compact()

    def callers_left(self, count: int, now: float) -> None:
        """``count`` calls ended at ``now`` unanswered, their deadline past,
        wherever their inputs were: still queued, or already out (in a
        running batch, or sent to a broker and read by a worker too late).
        Each is a caller seen leaving
        (:meth:`~streamer_core.batching.overload.StandingQueue.caller_left`): a Redis
        web process served first come first served sends inputs that are
        still alive, and its callers leave while those are out, never
        seen in its queue."""
        if self.standing.on:
            self.standing.callers_left(count, now)

    def compact(self) -> None:
        """Drop every given-up input now."""
        self._queue.compact()
        self._alone = deque(kept(self._alone, self._live, self._drop))
        self._parked.compact()
        self._dead = 0

    # -- when a batch goes ---------------------------------------------------------

    def alone_waiting(self) -> bool:
        """Whether an input waits to run alone (given-up ones at the head dropped)."""
        alone, live = self._alone, self._live
        while alone and not live(alone[0]):
            self._drop(alone.popleft())
        return bool(alone)

    def full(self) -> bool:
        """Whether a batch as full as it can be waits: ``batch_size``
        inputs, or more than one batch's budget of cost."""
        waiting = self._in_line()
        return waiting >= self.size or (self.shaped and waiting > 0 and self.over_budget())

    def over_budget(self) -> bool:
        """Whether the queued inputs are more than one batch's budget: a batch
        is as full as it can be. Called with fewer than ``batch_size``
        inputs queued, so it looks at fewer than ``batch_size``."""
        queue, live = self._queue, self._live
        return self.shaper.line_over_budget(
            len(queue), self._bound, lambda: [each.cost for each in queue if live(each)]
        )

    def hold_until(self, now: float) -> float:
        """Until when the batch waiting may still wait for companions (a time
        ``<= now``: it goes now); ``inf`` with nothing waiting."""
        oldest = self._oldest_in_line()
        return self.policy.hold_until(oldest.arrival, now) if oldest is not None else math.inf

    def decide(self, now: float, go_now: bool = False) -> Tuple[Optional[List[T]], float]:
        """For a free worker: the batch to run now, or when to look again
        (``inf``: when something arrives). An input to run alone goes first;
        a full batch at once; with ``go_now`` (closing, the last batch of a
        worker that stops) whatever waits; else the batch waits while the
        hold policy says."""
        alone, live = self._alone, self._live
        while alone:
            first = alone.popleft()
            if live(first):
                return [first], now
            self._drop(first)
        oldest = self._oldest_in_line()
        if oldest is None:
            self._dead = 0
            return None, now + GATED_RECHECK_S if self.gated else math.inf
        size = self.size
        if self._room is not None:
            size = min(size, self._room(self._queue.level_next()))
            if size <= 0:  # held back until answers make room: everything waiting is left behind
                if self.standing.on:
                    self.standing.taken(True, now)
                return None, now + GATED_RECHECK_S
        if go_now or len(self._queue) >= size or (self.shaped and self.over_budget()):
            return self.take(size), now
        hold_until = self.policy.hold_until(oldest.arrival, now)
        if now >= hold_until:
            return self.take(size), now
        return None, hold_until

    def take(self, size: Optional[int] = None) -> List[T]:
        """The next batch, of at most ``size`` inputs (default
        ``batch_size``): the oldest inputs, or shaped by cost; while the
        queue stands, the newest, those waiting too long refused first."""
        size = self.size if size is None else size
        standing = self.standing
        newest = False
        if standing.on:
            now = time.monotonic()
            newest = standing.overloaded(now)
            if newest:
                self._shed_waited(standing.oldest_kept(now, self.policy.service))
        if not self.shaped:
            batch = self._queue.pop(size, newest)
        else:
            batch = take_shaped(self._queue, self.shaper, size, SHAPING_WINDOW * self.size, newest)
            self._rebound()
        if self._parked:
            self.add(self._parked.unpark(len(batch)))
        if standing.on:
            standing.taken(self.in_queue() > 0, now)
        return batch

    def learn(self, costs: Sequence[float], out_of_memory: bool, ran: Sequence[Tuple[int, int]]) -> None:
        """Learn from a batch of inputs of these ``costs`` that ran: if it ran
        out of memory (``ran``: the spans of it whose model calls returned),
        cap later batches at the cost of the costliest part that ran; if
        not, count it towards lifting such a cap (see
        :class:`~streamer_core.batching.shaping.CostCap`)."""
        self.shaper.learn(costs, out_of_memory, ran)
        self.shaped = self.shaper.active

    # -- inside ------------------------------------------------------------------

    def _oldest_in_line(self) -> Optional[T]:
        """The oldest live input in line (its queue's ``oldest()``), the
        line refilled from the parked calls when it ran dry (its inputs all
        given up), or, gated (:meth:`gate_parked`), whenever a call's gate
        lets more in: answers came since the batch that left them out."""
        oldest = self._queue.oldest()
        if self._parked and (oldest is None or self._parked.out_limit is not None):
            self.add(self._parked.unpark(self._turn()))
            oldest = self._queue.oldest()
        return oldest

    def _in_line(self) -> int:
        """How many inputs wait in line (:meth:`_oldest_in_line`; given-up ones may still be counted)."""
        return 0 if self._oldest_in_line() is None else len(self._queue)

    def _turn(self) -> int:
        """How many of a large call's inputs wait in line at a time."""
        return self.size * SHAPED_TURN if self.shaped else self.size

    def _shed_waited(self, oldest_kept: float) -> None:
        """Take out every input in line that arrived before ``oldest_kept``:
        under overload, refused (``shed``) if its call still waits, else
        dropped."""
        live = self._live
        for each in self._queue.taken_before(oldest_kept):
            if live(each):
                self._shed(each)
            else:
                self._drop(each)

    def _rebound(self) -> None:
        """Make the bound on what the queued inputs cost tight again."""
        self._bound.tighten([each.cost for each in self._queue])


def _always(_: Any) -> bool:
    return True


def _ignore(_: Any) -> None:
    pass
