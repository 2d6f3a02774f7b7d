"""The calls of this process, their deadlines, and the workers that take
their batches: the :class:`Scheduler` of the thread and process backends.

One call (``submit(batch)``) is a :class:`_Task` with one :class:`BatchFuture`;
each of its inputs is an :class:`_Item`, waiting in the scheduler's
:class:`~streamer_core.batching.former.BatchFormer`, which says when a batch goes and
what it holds (the same rule as a Redis worker's). A dispatcher thread asks
:meth:`Scheduler.next_batch` for work whenever a worker has room, and the
backend hands the batch to that worker. Results come back per item and
complete the task's future once every item has one.

When does a batch go? At once when ``batch_size`` items are queued or the
oldest item has waited ``max_latency`` seconds since *its* arrival. Otherwise
only a free worker matters, and waiting for companions helps only if some are
on their way. The scheduler knows one source of them for sure: callers whose
results it has just delivered tend to come straight back (a closed loop, as a
client pool or a busy web server is). So after delivering ``n`` results it
holds a partial batch until about ``n`` new items have arrived, for at most a
quarter of the model's recent service time, or for as long as answered callers
have lately taken to come back (through a broker, that is longer), within one
service time; when nobody is due, a lone request goes to the model immediately. A
single client therefore sees the model's own latency, while 64 clients fill
batches of 64 (:mod:`streamer_core.batching.hold`).

An input that could not be answered within its call's timeout is not run:
as a batch forms, an input whose deadline comes sooner than the fastest of
the model's latest batches could end (twice that for a batch handed ahead
to a busy worker, which first finishes the one it runs) is dropped, and its
call fails with :class:`StreamerTimeoutError` at once. Only while at least
three batches ended in the last 10 seconds (:meth:`HoldPolicy.fastest`): a
cold start is one batch, and a model left idle by this rule is given
batches again once its estimate is stale. Under an overload
whose callers give up and retry, first come first served would otherwise
run nothing but inputs about to expire, their answers read by nobody.
"""

from __future__ import annotations

import time
from typing import Any, Callable, List, Optional, Sequence, Tuple

from streamer_core.batching.deadlines import Deadlines
from streamer_core.batching.former import BatchFormer
from streamer_core.batching.levels import LeveledFormer
from streamer_core.errors import (
    OverloadedError,
    QueueFullError,
    StreamerClosedError,
    StreamerTimeoutError,
    WorkerDiedError,
)
from streamer_core.future import BatchFuture, settle
from streamer_core.green import Condition
from streamer_core.options.config import BatchingConfig
from streamer_core.telemetry.stats import ModelStats
from streamer_core.telemetry.tracing import CallTrace

__all__ = ["Scheduler", "Outcome", "deliver", "live_items"]

#: A per-item result: ``(True, value)`` or ``(False, exception)``.
Outcome = Tuple[bool, Any]


class _Task:
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


class _Item:
    """One input of a task, queued for the model. ``value`` is what the backend
    sends to its worker (the input itself, or its pickle)."""

    __slots__ = ("task", "index", "value", "arrival", "crashes", "cost", "level")

    def __init__(self, task: _Task, index: int, value: Any, arrival: float, cost: float = 1.0, level: int = 0) -> None:
        self.task = task
        self.index = index
        self.value = value
        self.arrival = arrival
        self.crashes = 0
        self.cost = cost
        #: Its call's priority level, 0 the highest (see :mod:`streamer_core.batching.levels`).
        self.level = level


def _unanswered(item: _Item) -> int:
    """How many inputs of ``item``'s call have no answer yet."""
    return item.task.remaining


def live_items(items: Sequence[_Item], stats: Optional[ModelStats]) -> List[_Item]:
    """The items of a batch whose calls still wait for them; the others
    are dropped unrun, counted by why (a backend's last look before its
    model runs the batch)."""
    kept = [item for item in items if item.task.live()]
    if len(kept) < len(items) and stats is not None:
        for item in items:
            if not item.task.live():
                stats.dropped(item.task.why())
    return kept


def deliver(items: Sequence[_Item], outcomes: Sequence[Outcome]) -> None:
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


class Scheduler:
    """The FIFO queue of items, the batching rule, and call deadlines.

    Backends report worker capacity with :meth:`add_slot`,
    :meth:`batch_done`, :meth:`batch_returned` and :meth:`worker_lost`; the
    dispatcher thread calls :meth:`next_batch`, which returns only while a
    worker has room. The dispatcher also fails calls whose deadline passed,
    wherever their items are (queued or on a worker), so a ``submit()`` future
    always completes.
    """

    def __init__(
        self,
        config: BatchingConfig,
        max_item_crashes: int = 2,
        stats: Optional[ModelStats] = None,
        shed_late: bool = True,
    ) -> None:
        self._config = config
        #: Where calls and batches are counted; backends record model calls here.
        self.stats = stats
        self._max_item_crashes = max_item_crashes
        self._cond = Condition()
        # The items waiting, and when and how they become a batch. Batches are
        # shaped by cost when the config asks, and while a cap learned from
        # running out of memory holds (on the count, without an item_cost:
        # each input costs 1).
        costed = config.item_cost is not None
        self._former: BatchFormer[_Item] = BatchFormer(config, costed, self._live, self._dropped, self._shed)
        # With priority levels, one line per level (see streamer_core.batching.levels).
        self._leveled: Optional[LeveledFormer[_Item]] = None
        if config.priority_levels > 1:
            self._former = self._leveled = LeveledFormer(config, costed, self._live, self._dropped, self._shed)
        # Inputs that would end past their deadline are not run (see the
        # module's doc): while a batch forms, those due before _late_before.
        # Off where batches here are not the model's (sends to a broker).
        self._shed_late = shed_late
        self._late_before = float("-inf")
        self._deadlines: Deadlines[_Task] = Deadlines(config.timeout)
        # Worker capacity: each worker holds up to two batches, the one it runs
        # and, when a full batch is waiting, the next one, so it never idles
        # between batches under load.
        self._idle = 0  # workers holding no batch
        self._busy = 0  # workers holding one batch (room for a full one more)
        self._in_flight = 0  # batches handed out and not yet done or lost
        self._closing = False
        self._stopped = False
        self._broken: Optional[Callable[[], BaseException]] = None

    def _live(self, item: _Item) -> bool:
        """Whether an item's call still waits for it, and could be answered
        in time by a batch forming now (the former drops the rest)."""
        future = item.task.future
        return future is not None and future._state == "PENDING" and future._deadline >= self._late_before

    def _dropped(self, item: _Item) -> None:
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
        if self.stats is not None:
            self.stats.dropped(task.why())

    def _shed(self, item: _Item) -> None:
        """Under overload the former refused ``item``, which waited too long
        in a queue that stands (:mod:`streamer_core.batching.overload`): its call
        fails with :class:`OverloadedError` (503, ``Retry-After``)."""
        task = item.task
        standing = self._former.standing
        waited = time.monotonic() - item.arrival
        task.fail(
            OverloadedError(
                f"the model is overloaded: this call waited {waited:.2g}s in a queue that has not emptied for "
                f"{standing.after_s:.2g}s or more, longer than the {standing.wait_s:.2g}s (overload_wait) an input "
                "waits then; the newest calls are served first: retry"
            )
        )
        if self.stats is not None:
            self.stats.dropped(task.why())

    def _forming(self, now: float, held: int) -> None:
        """A batch forms now for a worker holding ``held`` batches: inputs
        due before the fastest recent batch (one per batch held and this
        one) could end are late."""
        fastest = self._former.policy.fastest(now) if self._shed_late else None
        self._late_before = float("-inf") if fastest is None else now + (held + 1) * fastest

    # -- the callers' side -------------------------------------------------

    def put(
        self,
        values: Sequence[Any],
        timeout: float,
        costs: Optional[Sequence[float]] = None,
        trace: Optional[CallTrace] = None,
        level: int = 0,
    ) -> BatchFuture:
        """Queue one call's inputs (already encoded by the backend), with
        their costs when the streamer has an ``item_cost``, the span it
        was made in when the streamer traces, at priority ``level`` (0 the
        highest; checked by the streamer)."""
        future = BatchFuture()
        stats = self.stats
        future._stats = stats if stats is None or self._leveled is None else stats.at(level)
        n = len(values)
        now = time.monotonic()
        future._deadline = deadline = now + timeout
        future._timeout_s = timeout
        task = _Task(future, n, timeout, trace)
        if level:
            ones = [1.0] * n if costs is None else costs
            items: Sequence[_Item] = [_Item(task, i, v, now, c, level) for i, (v, c) in enumerate(zip(values, ones))]
        elif n == 1:  # most calls: one input
            items = (_Item(task, 0, values[0], now) if costs is None else _Item(task, 0, values[0], now, costs[0]),)
        elif costs is not None:
            items = [_Item(task, i, v, now, c) for i, (v, c) in enumerate(zip(values, costs))]
        else:
            items = [_Item(task, i, v, now) for i, v in enumerate(values)]
        cond = self._cond
        with cond:
            if self._closing:
                raise StreamerClosedError("this streamer is closed; create a new one to make more calls")
            if self._broken is not None:
                raise self._broken()
            former = self._former
            limit = self._config.max_queue
            if self._leveled is not None:
                self._make_room(self._leveled, level, n)
            elif limit is not None and former.in_queue() + n > limit:
                former.compact()
                if former.in_queue() + n > limit:
                    raise QueueFullError(
                        f"the queue holds {former.in_queue()} items and max_queue is {limit}: "
                        "retry later, add workers, or raise max_queue"
                    )
            was_empty = not former.in_queue()
            former.add_call(items)
            if self._deadlines.add(deadline, task):
                cond.notify()  # sooner than the deadline the dispatcher sleeps until
            due = former.policy.arrived(n, now)
            full = former.in_queue() >= former.size or (former.shaped and former.over_budget())
            if (self._idle > 0 and (was_empty or due == 0 or full)) or (full and self._busy > 0):
                cond.notify()
        return future

    def _make_room(self, former: LeveledFormer[_Item], level: int, n: int) -> None:
        """Raise :class:`QueueFullError` unless ``n`` more inputs fit in ``level``'s bound."""
        limit = self._config.queue_limit(level)
        if limit is not None and former.in_level(level) + n > limit:
            former.compact()
            if former.in_level(level) + n > limit:
                raise QueueFullError(
                    f"priority {level + 1} holds {former.in_level(level)} items and its bound is {limit}: "
                    "retry later, add workers, or raise its bound (priority_max_queue or max_queue)"
                )

    def queued_by_level(self) -> List[int]:
        """Inputs waiting at each priority level, the highest first (one level: all of them)."""
        with self._cond:
            if self._leveled is None:
                return [len(self._former)]
            return self._leveled.levels_waiting()

    # -- the dispatcher's side ---------------------------------------------

    def next_batch(self) -> Optional[Tuple[List[_Item], int]]:
        """Block until a worker has room and a batch should go. Return the
        batch and how many batches the worker to take it holds already (0: an
        idle worker; 1: a busy one, given a full batch to start next), or
        ``None`` once the scheduler is stopped."""
        cond = self._cond
        with cond:
            while True:
                now = time.monotonic()
                wake = self._expire(now)
                if self._stopped:
                    return None  # until then, even while closing, deadlines are kept and returned inputs rerun
                former = self._former
                if self._idle > 0:
                    self._forming(now, 0)
                    batch, hold_until = former.decide(now, go_now=self._closing)
                    self._late_before = float("-inf")
                    if batch:
                        self._handed(0)
                        return batch, 0
                    wake = min(wake, hold_until)
                elif self._busy > 0 and not former.alone_waiting() and former.full() and self._may_hand_ahead():
                    # Not while inputs of a crashed batch wait to run alone:
                    # only a free worker takes those (decide), and under
                    # load a busy one always handed the next full batch
                    # would never be free, leaving them to their timeout.
                    self._forming(now, 1)
                    batch = former.take()
                    self._late_before = float("-inf")
                    if batch:
                        self._handed(1)
                        return batch, 1
                cond.wait(None if wake == float("inf") else max(0.0, wake - now))

    def _may_hand_ahead(self) -> bool:
        """Whether a busy worker may be handed the next full batch now.
        With priority levels, only one of the highest level's inputs alone:
        a batch of lower levels handed ahead would hold up every higher
        input that comes while the worker runs the batch before it."""
        leveled = self._leveled
        return leveled is None or leveled.in_level(0) >= leveled.size

    def _handed(self, held: int) -> None:
        self._count(held, -1)
        self._count(held + 1, +1)
        self._in_flight += 1

    def _count(self, held: int, delta: int) -> None:
        if held == 0:
            self._idle += delta
        elif held == 1:
            self._busy += delta

    # -- deadlines -----------------------------------------------------------

    def _expire(self, now: float) -> float:
        """Fail every call past its deadline; return the next deadline."""
        expired = calls = 0
        for task in self._deadlines.pop_expired(now):
            if task.future is not None:
                expired += task.size
                calls += 1
                task.fail(StreamerTimeoutError(f"the call did not finish within its timeout of {task.timeout:.3g}s"))
        if expired:
            self._former.callers_left(calls, now)
            self._former.given_up(expired)
        return self._deadlines.soonest()

    # -- the backends' side --------------------------------------------------

    def add_slot(self) -> None:
        """A worker became ready to take batches."""
        with self._cond:
            self._idle += 1
            self._cond.notify()

    def learn(
        self, items: Sequence[_Item], out_of_memory: bool, ran: Sequence[Tuple[int, int]], oom_splits: int
    ) -> None:
        """Learn from a batch that ran: if it ran out of memory (``ran``: the
        spans of it whose model calls returned; ``oom_splits``: how many
        times it or a part was split for it, counted in the stats), cap
        later batches at the cost of the costliest part that ran; if not,
        count it towards lifting such a cap (see
        :class:`~streamer_core.batching.shaping.CostCap`)."""
        former = self._former
        if not out_of_memory and not former.shaper.cap.active:
            return  # the common case: no lock taken, no list made
        if oom_splits and self.stats is not None:
            self.stats.oom_split(oom_splits)
        costs = [item.cost for item in items]
        with self._cond:
            former.learn(costs, out_of_memory, ran)

    @property
    def cost_cap(self) -> float:
        """The cap on a batch's cost learned from running out of memory (``inf``: none)."""
        return self._former.shaper.cap.limit

    def batch_done(self, size: int, seconds: float, held_after: int) -> None:
        """A worker finished a batch of ``size`` items, which ran for
        ``seconds``, and holds ``held_after`` batches now. Call it *before*
        delivering the results, so the callers who come straight back are
        counted as expected. ``size`` 0: the batch was dropped unrun (every
        call in it had been given up)."""
        with self._cond:
            self._count(held_after + 1, -1)
            self._count(held_after, +1)
            self._in_flight -= 1
            if size:
                self._former.policy.delivered(size, seconds, time.monotonic())
            self._cond.notify_all()

    def callers_returning(self, now: float) -> bool:
        """Whether callers answered lately are still coming back: some are
        due, and one came back (or they were answered) within the last
        millisecond."""
        with self._cond:
            return self._former.policy.still_arriving(now)

    def answered(self, n: int, seconds: float) -> None:
        """``n`` calls passed on elsewhere (to a broker) are being answered,
        ``seconds`` after they arrived: their callers are expected back, as
        after :meth:`batch_done`, for backends whose batches end before
        their answers come."""
        with self._cond:
            self._former.policy.delivered(n, seconds, time.monotonic())

    def hold_back(self, room: Callable[[int], int]) -> None:
        """Hand out no more than ``room(level)`` inputs at a time, none while it is
        0 (:meth:`BatchFormer.hold_back`): for a backend whose batches leave
        as soon as they are taken, a Redis web process, whose workers can
        take only so many in time. It calls :meth:`wake_parked` as answers
        make room."""
        with self._cond:
            self._former.hold_back(room)

    def gate_parked(self, out_limit: Callable[[], int]) -> None:
        """Hold each large call's parked inputs while ``out_limit()`` of its
        others are out, unanswered (see
        :meth:`BatchFormer.gate_parked`): for a backend whose batches leave
        as soon as they are taken, a Redis web process, whose workers read
        its requests in the order they were sent. It calls
        :meth:`wake_parked` as answers reach their calls."""
        with self._cond:
            self._former.gate_parked(out_limit, _unanswered)

    def wake_parked(self) -> None:
        """Answers reached their calls: inputs held at their call's gate may
        join the line now (a look from the dispatcher, where any are held)."""
        if self._former.gated:
            with self._cond:
                self._cond.notify()

    def batch_returned(self, items: Sequence[_Item], held: int) -> None:
        """A batch meant for a worker holding ``held`` batches could not be
        handed to it (it died meanwhile): queue the items again, first."""
        with self._cond:
            self._former.put_back(items)
            self._count(held + 1, -1)
            self._count(held, +1)
            self._in_flight -= 1
            self._cond.notify_all()

    def worker_lost(
        self, batches: Sequence[Sequence[_Item]], reason: str, unstarted: Sequence[Sequence[_Item]] = ()
    ) -> None:
        """A ready worker died holding ``batches`` (which it may have run)
        and ``unstarted`` (sent ahead, known not to have reached the model).
        Each item of ``batches`` is run again alone, unless it has now been
        in ``max_item_crashes`` crashed batches: then its call fails with
        :class:`WorkerDiedError`. Those of ``unstarted`` queue again, first,
        as they were."""
        with self._cond:
            self._count(len(batches) + len(unstarted), -1)
            self._in_flight -= len(unstarted)
            former = self._former
            former.put_back([item for items in unstarted for item in items if item.task.live()])
            for items in batches:
                self._in_flight -= 1
                for item in items:
                    item.crashes += 1
                    if item.crashes >= self._max_item_crashes:
                        item.task.fail(
                            WorkerDiedError(
                                f"{reason}; this input was in {item.crashes} batches whose worker died, "
                                "so it is not retried (it may be what kills the worker)"
                            )
                        )
                    elif item.task.live():
                        former.add_alone([item])
            self._cond.notify_all()

    def set_broken(self, make_error: Callable[[], BaseException]) -> None:
        """No worker can run: fail every call now and every new one at once."""
        with self._cond:
            self._broken = make_error
            self._fail_all(make_error)
            self._cond.notify_all()

    @property
    def broken(self) -> bool:
        return self._broken is not None

    # -- closing -------------------------------------------------------------

    def begin_close(self) -> None:
        """Refuse new calls; queued ones are still dispatched, without waiting for companions."""
        with self._cond:
            self._closing = True
            self._cond.notify_all()

    def wait_drained(self, deadline: float) -> bool:
        """Wait until nothing is queued or running and every call has its answer (a batch is done
        before its answers reach their calls), or ``deadline`` passes."""
        with self._cond:
            while len(self._former) or self._in_flight > 0 or any(task.live() for task in self._deadlines.tasks()):
                if self._stopped or self._broken is not None:
                    break
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self._cond.wait(min(remaining, 0.05))
            return True

    def stop(self, make_error: Callable[[], BaseException]) -> None:
        """Fail everything still pending with ``make_error()`` and release the
        dispatcher."""
        with self._cond:
            self._closing = self._stopped = True
            self._fail_all(make_error)
            self._cond.notify_all()

    def _fail_all(self, make_error: Callable[[], BaseException]) -> None:
        for task in self._deadlines.tasks():
            if task.future is not None:
                task.fail(make_error())
        for item in self._former:
            if item.task.future is not None:
                item.task.fail(make_error())
        self._deadlines.clear()
        self._former.clear()

    def queued(self) -> int:
        """Items waiting for a worker (calls given up may still be counted)."""
        with self._cond:
            return len(self._former)
