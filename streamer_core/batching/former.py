"""Where batches form: :class:`BatchFormer`, the inputs waiting for the
model and the rule that says when a batch goes and what it holds.

One former serves wherever a batch forms: the in-process
:class:`~streamer_core.batching.scheduler.Scheduler` (thread and process backends),
which feeds it the calls of this process, and the Redis worker, which feeds
it the requests it reads from the stream. So a batch is formed by one rule
everywhere:

- inputs wait in arrival order; an input that must run alone (one of a
  batch whose worker died, or taken over from a dead Redis worker) goes
  first, by itself;
- a call of more inputs than a batch holds (:meth:`BatchFormer.add_call`)
  does not line up all at once: one batch's worth of it waits in line
  (:data:`SHAPED_TURN` batches' worth when shaped by cost), the rest is
  parked, and after each batch taken as many parked inputs as it held
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
from typing import Any, Callable, Deque, Generic, Iterator, List, Optional, Protocol, Sequence, Tuple, TypeVar

from streamer_core.batching.hold import HoldPolicy
from streamer_core.batching.overload import LEAVING_MOST, StandingQueue
from streamer_core.batching.shaping import CostShaper
from streamer_core.options.config import BatchingConfig

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


class Waiting(Protocol):
    """What the former needs of an input."""

    cost: float
    arrival: float


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
    it, the queue is served in arrival order whatever its length)."""

    def __init__(
        self,
        config: BatchingConfig,
        costed: bool,
        live: Optional[Callable[[T], bool]] = None,
        dropped: Optional[Callable[[T], None]] = None,
        shed: Optional[Callable[[T], None]] = None,
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
            told = self._counting_drops(told)
        self._drop: Callable[[T], None] = told
        self._shed: Callable[[T], None] = shed if shed is not None else _ignore
        # Where batches leave as soon as they are taken (hold_back): how
        # many more inputs of a level may go now (None: no bound).
        self._room: Optional[Callable[[int], int]] = None
        self._queue: Deque[T] = deque()
        self._alone: Deque[T] = deque()  # inputs to run one at a time, first
        # The inputs of large calls not yet in line: each call's in its
        # order, the calls in the order they take turns (see add_call).
        self._parked: Deque[Deque[T]] = deque()
        self._parked_count = 0
        # Where parked inputs are gated (gate_parked): how many inputs of a
        # call may be out, and how many of a call's inputs are not answered
        # yet (given its first).
        self._out_limit: Optional[Callable[[], int]] = None
        self._unanswered: Callable[[T], int] = _nothing_out
        self._dead = 0  # inputs in the queue given up, about: triggers a compaction
        # What every queued input costs, given-up ones too, at most: a bound
        # that tells most arrivals at once that a batch is not full yet
        # (see over_budget), kept as inputs arrive, made tight per batch.
        self._bound_top = 0.0
        self._bound_sum = 0.0

    # -- what waits --------------------------------------------------------------

    def add(self, inputs: Sequence[T]) -> None:
        """Queue ``inputs`` behind those waiting."""
        self._queue.extend(inputs)
        if len(inputs) == 1:  # the common case, without a generator
            cost = inputs[0].cost
            self._bound_top = max(self._bound_top, cost)
            self._bound_sum += cost
        elif inputs:
            costs = [each.cost for each in inputs]
            self._bound_top = max(self._bound_top, max(costs))
            self._bound_sum += sum(costs)

    def add_call(self, inputs: Sequence[T]) -> None:
        """Queue one call's ``inputs``: up to a batch's worth behind those
        waiting, the rest parked to join the line a batch's worth at a time
        (see the module's doc); gated (:meth:`gate_parked`), no more than
        may be out."""
        turn = self._turn() if self._out_limit is None else max(1, min(self._turn(), self._out_limit()))
        if len(inputs) <= turn:
            self.add(inputs)
            return
        self.add(inputs[:turn])
        self._parked.append(deque(inputs[turn:]))
        self._parked_count += len(inputs) - turn

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
        self._out_limit = out_limit
        self._unanswered = unanswered

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
        return (self._out_limit is not None and bool(self._parked)) or (self._room is not None and self.in_queue() > 0)

    def add_alone(self, inputs: Sequence[T]) -> None:
        """Queue ``inputs`` to run one by one, before the others."""
        self._alone.extend(inputs)

    def put_back(self, inputs: Sequence[T]) -> None:
        """Queue ``inputs`` again at the head, in their order (a batch that
        could not be handed out, or that a dead worker never started)."""
        self._queue.extendleft(reversed(inputs))
        self._rebound()

    def in_queue(self) -> int:
        """Inputs waiting in line or parked (given-up ones may still be
        counted), those waiting to run alone not included: what a bound
        on the queue counts."""
        return len(self._queue) + self._parked_count

    def __len__(self) -> int:
        """Every input waiting, alone and parked ones included (given-up ones may still be counted)."""
        return self.in_queue() + len(self._alone)

    def __iter__(self) -> Iterator[T]:
        yield from self._alone
        yield from self._queue
        for call in self._parked:
            yield from call

    def clear(self) -> None:
        self._queue.clear()
        self._alone.clear()
        self._parked.clear()
        self._parked_count = 0
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
            for _ in range(min(count, LEAVING_MOST)):
                self.standing.caller_left(now)

    def compact(self) -> None:
        """Drop every given-up input now."""
        self._queue = deque(self._kept(self._queue))
        self._alone = deque(self._kept(self._alone))
        parked = (deque(self._kept(call)) for call in self._parked)
        self._parked = deque(call for call in parked if call)
        self._parked_count = sum(map(len, self._parked))
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
        queue = self._in_line()
        return len(queue) >= self.size or (self.shaped and bool(queue) and self.over_budget())

    def over_budget(self) -> bool:
        """Whether the queued inputs are more than one batch's budget: a batch
        is as full as it can be. Called with fewer than ``batch_size``
        inputs queued, so it looks at fewer than ``batch_size``."""
        shaper = self.shaper
        budget = shaper.budget()
        if math.isinf(budget):
            return False
        bound = len(self._queue) * self._bound_top if shaper.rule == "max" else self._bound_sum
        if bound <= budget:
            return False  # even counting every queued input at its most
        live = self._live
        return shaper.over_budget([each.cost for each in self._queue if live(each)])

    def hold_until(self, now: float) -> float:
        """Until when the batch waiting may still wait for companions (a time
        ``<= now``: it goes now); ``inf`` with nothing waiting."""
        queue = self._in_line()
        return self.policy.hold_until(queue[0].arrival, now) if queue else math.inf

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
        queue = self._in_line()
        if not queue:
            self._dead = 0
            return None, now + GATED_RECHECK_S if self.gated else math.inf
        size = self.size
        if self._room is not None:
            size = min(size, self._room(self._level_next()))
            if size <= 0:  # held back until answers make room: everything waiting is left behind
                if self.standing.on:
                    self.standing.taken(True, now)
                return None, now + GATED_RECHECK_S
        if go_now or len(queue) >= size or (self.shaped and self.over_budget()):
            return self.take(size), now
        hold_until = self.policy.hold_until(queue[0].arrival, now)
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
            batch = self._pop(size, newest)
        else:
            batch = self._pop_shaped(size, newest)
            self._rebound()
        if self._parked:
            self._unpark(len(batch))
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

    def _in_line(self) -> Sequence[T]:
        """What waits in line (:meth:`_skip_given_up`), refilled from the
        parked calls when it ran dry (its inputs all given up), or, gated
        (:meth:`gate_parked`), whenever a call's gate lets more in: answers
        came since the batch that left them out."""
        queue = self._skip_given_up()
        if self._parked and (not queue or self._out_limit is not None):
            self._unpark(self._turn())
            queue = self._skip_given_up()
        return queue

    def _level_next(self) -> int:
        """The priority level whose input a batch would take first (one level here)."""
        return 0

    def _turn(self) -> int:
        """How many of a large call's inputs wait in line at a time."""
        return self.size * SHAPED_TURN if self.shaped else self.size

    def _unpark(self, count: int) -> None:
        """Move up to ``count`` parked inputs to the back of the line: the
        next call's in turn, then the next; a call given up is dropped; a
        call at its gate (:meth:`gate_parked`) keeps its turn."""
        parked, live = self._parked, self._live
        limit = None if self._out_limit is None else self._out_limit()
        held: List[Deque[T]] = []  # calls at their gate, in turn
        while count > 0 and parked:
            call = self._next_parked()
            if not live(call[0]):  # its call ended (one future for all its inputs)
                self._parked_count -= len(call)
                for each in call:
                    self._drop(each)
                continue
            room = len(call) if limit is None else limit - (self._unanswered(call[0]) - len(call))
            if room <= 0:
                held.append(call)
                continue
            moved = [call.popleft() for _ in range(min(count, room, len(call)))]
            self._parked_count -= len(moved)
            count -= len(moved)
            self.add(moved)
            if call:
                parked.append(call)
        parked.extendleft(reversed(held))

    def _next_parked(self) -> Deque[T]:
        """The parked call whose turn it is, taken out of the turns."""
        return self._parked.popleft()

    def _skip_given_up(self) -> Sequence[T]:
        """The queue, after dropping given-up inputs at its head."""
        queue, live = self._queue, self._live
        while queue and not live(queue[0]):
            self._drop(queue.popleft())
        return queue

    def _pop(self, size: int, newest: bool = False) -> List[T]:
        """The ``size`` oldest live inputs in line (``newest``: the newest)."""
        queue, live = self._queue, self._live
        pop = queue.pop if newest else queue.popleft
        batch: List[T] = []
        while queue and len(batch) < size:
            first = pop()
            if live(first):
                batch.append(first)
            else:
                self._drop(first)
        return batch

    def _pop_shaped(self, size: int, newest: bool = False) -> List[T]:
        """A batch of at most ``size`` led by the oldest waiting input
        (``newest``: the newest), shaped by
        :func:`~streamer_core.batching.shaping.shape_batch` from the next
        :data:`SHAPING_WINDOW` batches' worth of waiting inputs from that
        end; the rest wait on, in their order."""
        window = self._pop(SHAPING_WINDOW * self.size, newest)
        taken = self.shaper.shape([each.cost for each in window])[:size]
        chosen = set(taken)
        self._give_back([each for i, each in enumerate(window) if i not in chosen], newest)
        return [window[i] for i in taken]

    def _counting_drops(self, told: Callable[[T], None]) -> Callable[[T], None]:
        """``told``, each drop also counted as a caller seen leaving (see
        :meth:`~streamer_core.batching.overload.StandingQueue.caller_left`)."""
        left = self.standing.caller_left

        def dropped(each: T) -> None:
            left(time.monotonic())
            told(each)

        return dropped

    def _give_back(self, inputs: List[T], newest: bool) -> None:
        """Put back what :meth:`_pop` took and a batch did not hold, in
        line where it was (``newest``: taken from the back)."""
        if newest:
            self._queue.extend(reversed(inputs))
        else:
            self._queue.extendleft(reversed(inputs))

    def _shed_waited(self, oldest_kept: float) -> None:
        """Take out every input in line that arrived before ``oldest_kept``:
        under overload, refused (``shed``) if its call still waits, else
        dropped. Inputs wait in line in their order of arrival but for a
        large call's, which join it later: those are met as their call's
        first inputs are refused, their call then over."""
        queue, live = self._queue, self._live
        while queue and queue[0].arrival < oldest_kept:
            first = queue.popleft()
            if live(first):
                self._shed(first)
            else:
                self._drop(first)

    def _kept(self, inputs: Deque[T]) -> Iterator[T]:
        """The live ones of ``inputs``; the others told to the owner as dropped."""
        live, drop = self._live, self._drop
        for each in inputs:
            if live(each):
                yield each
            else:
                drop(each)

    def _rebound(self) -> None:
        """Make the bound on what the queued inputs cost tight again."""
        costs = [each.cost for each in self._queue]
        self._bound_top, self._bound_sum = max(costs, default=0.0), float(sum(costs))


def _always(_: Any) -> bool:
    return True


def _nothing_out(_: Any) -> int:
    return 0


def _ignore(_: Any) -> None:
    pass
