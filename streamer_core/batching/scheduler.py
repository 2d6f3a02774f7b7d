"""The calls of this process, their deadlines, and the workers that take
their batches: the :class:`Scheduler` of the thread and process backends.

One call (``submit(batch)``) is a :class:`~streamer_core.batching.calls.Task`
with one :class:`BatchFuture`; each of its inputs is an
:class:`~streamer_core.batching.calls.Item`, waiting in the scheduler's
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
call fails with :class:`StreamerTimeoutError` at once
(:mod:`streamer_core.batching.expiry`). Only while at least three batches
ended in the last 10 seconds (:meth:`HoldPolicy.fastest`): a cold start is
one batch, and a model left idle by this rule is given batches again once
its estimate is stale. Under an overload
whose callers give up and retry, first come first served would otherwise
run nothing but inputs about to expire, their answers read by nobody.
"""

from __future__ import annotations

import time
from typing import Any, Callable, List, Optional, Sequence, Tuple

from ..errors import StreamerClosedError
from ..future import BatchFuture
from ..green import Condition
from ..options.config import BatchingConfig
from ..telemetry.stats import ModelStats
from ..telemetry.tracing import CallTrace
from .calls import Item, Task, crashed, items_of, unanswered
from .capacity import WorkerCapacity
from .expiry import Expiry
from .former import BatchFormer
from .levels import make_room, waiting_queue
from .queues import WaitingQueue

__all__ = ["Scheduler"]


class Scheduler:
    """The queue of items, the batching rule, and call deadlines.

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
        # Calls past their deadline, or that no batch could answer in time
        # (see the module's doc; off where batches here are not the model's:
        # sends to a broker), or refused under overload.
        self._expiry = expiry = Expiry(config, stats, shed_late)
        # The items waiting, and when and how they become a batch: in one
        # line, or with priority levels one per level (streamer_core.batching.levels).
        # Batches are shaped by cost when the config asks, and while a cap
        # learned from running out of memory holds (on the count, without an
        # item_cost: each input costs 1).
        queue: WaitingQueue[Item] = waiting_queue(config)
        costed = config.item_cost is not None
        self._former: BatchFormer[Item] = BatchFormer(config, costed, expiry.live, expiry.dropped, expiry.shed, queue)
        self._leveled = config.priority_levels > 1
        self._workers = WorkerCapacity()
        self._closing = False
        self._stopped = False
        self._broken: Optional[Callable[[], BaseException]] = None

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
        future._stats = stats if stats is None or not self._leveled else stats.at(level)
        n = len(values)
        now = time.monotonic()
        future._deadline = deadline = now + timeout
        future._timeout_s = timeout
        task = Task(future, n, timeout, trace)
        items = items_of(task, values, now, costs, level)
        cond = self._cond
        with cond:
            if self._closing:
                raise StreamerClosedError("this streamer is closed; create a new one to make more calls")
            if self._broken is not None:
                raise self._broken()
            former = self._former
            make_room(former, self._config, level, n)
            was_empty = not former.in_queue()
            former.add_call(items)
            if self._expiry.deadlines.add(deadline, task):
                cond.notify()  # sooner than the deadline the dispatcher sleeps until
            due = former.policy.arrived(n, now)
            full = former.in_queue() >= former.size or (former.shaped and former.over_budget())
            workers = self._workers
            if (workers.idle > 0 and (was_empty or due == 0 or full)) or (full and workers.busy > 0):
                cond.notify()
        return future

    def queued_by_level(self) -> List[int]:
        """Inputs waiting at each priority level, the highest first (one level: all of them)."""
        with self._cond:
            if not self._leveled:
                return [len(self._former)]
            return self._former.levels_waiting()

    # -- the dispatcher's side ---------------------------------------------

    def next_batch(self) -> Optional[Tuple[List[Item], int]]:
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
                former, workers, expiry = self._former, self._workers, self._expiry
                if workers.idle > 0:
                    expiry.forming(now, 0, former.policy)
                    batch, hold_until = former.decide(now, go_now=self._closing)
                    expiry.formed()
                    if batch:
                        workers.handed(0)
                        return batch, 0
                    wake = min(wake, hold_until)
                elif workers.busy > 0 and not former.alone_waiting() and former.full() and self._may_hand_ahead():
                    # Not while inputs of a crashed batch wait to run alone:
                    # only a free worker takes those (decide), and under
                    # load a busy one always handed the next full batch
                    # would never be free, leaving them to their timeout.
                    expiry.forming(now, 1, former.policy)
                    batch = former.take()
                    expiry.formed()
                    if batch:
                        workers.handed(1)
                        return batch, 1
                cond.wait(None if wake == float("inf") else max(0.0, wake - now))

    def _may_hand_ahead(self) -> bool:
        """Whether a busy worker may be handed the next full batch now.
        With priority levels, only one of the highest level's inputs alone:
        a batch of lower levels handed ahead would hold up every higher
        input that comes while the worker runs the batch before it."""
        return not self._leveled or self._former.in_level(0) >= self._former.size

    # -- deadlines -----------------------------------------------------------

    def _expire(self, now: float) -> float:
        """Fail every call past its deadline; return the next deadline."""
        calls, expired, soonest = self._expiry.expire(now)
        if expired:
            self._former.callers_left(calls, now)
            self._former.given_up(expired)
        return soonest

    # -- the backends' side --------------------------------------------------

    def add_slot(self) -> None:
        """A worker became ready to take batches."""
        with self._cond:
            self._workers.added()
            self._cond.notify()

    def learn(
        self, items: Sequence[Item], out_of_memory: bool, ran: Sequence[Tuple[int, int]], oom_splits: int
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
            self._workers.done(held_after)
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
            self._former.gate_parked(out_limit, unanswered)

    def wake_parked(self) -> None:
        """Answers reached their calls: inputs held at their call's gate may
        join the line now (a look from the dispatcher, where any are held)."""
        if self._former.gated:
            with self._cond:
                self._cond.notify()

    def batch_returned(self, items: Sequence[Item], held: int) -> None:
        """A batch meant for a worker holding ``held`` batches could not be
        handed to it (it died meanwhile): queue the items again, first."""
        with self._cond:
            self._former.put_back(items)
            self._workers.returned(held)
            self._cond.notify_all()

    def worker_lost(
        self, batches: Sequence[Sequence[Item]], reason: str, unstarted: Sequence[Sequence[Item]] = ()
    ) -> None:
        """A ready worker died holding ``batches`` (which it may have run)
        and ``unstarted`` (sent ahead, known not to have reached the model).
        Each item of ``batches`` is run again alone, unless it has now been
        in ``max_item_crashes`` crashed batches: then its call fails with
        :class:`WorkerDiedError`. Those of ``unstarted`` queue again, first,
        as they were."""
        with self._cond:
            self._workers.lost(len(batches) + len(unstarted))
            self._former.put_back([item for items in unstarted for item in items if item.task.live()])
            self._former.add_alone(crashed(batches, reason, self._max_item_crashes))
            self._cond.notify_all()

    def set_broken(self, make_error: Callable[[], BaseException]) -> None:
        """No worker can run: fail every call now and every new one at once."""
        with self._cond:
            self._broken = make_error
            self._expiry.fail_all(make_error, self._former)
            self._former.clear()
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
            deadlines = self._expiry.deadlines
            while len(self._former) or self._workers.in_flight > 0 or any(task.live() for task in deadlines.tasks()):
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
            self._expiry.fail_all(make_error, self._former)
            self._former.clear()
            self._cond.notify_all()

    def queued(self) -> int:
        """Items waiting for a worker (calls given up may still be counted)."""
        with self._cond:
            return len(self._former)
