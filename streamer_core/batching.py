"""The queue of items and the rule that turns it into batches.

One call (``submit(batch)``) is a :class:`_Task` with one :class:`BatchFuture`;
each of its inputs is an :class:`_Item` in the :class:`Scheduler`'s FIFO queue.
A dispatcher thread asks :meth:`Scheduler.next_batch` for work whenever a
worker is free, and the backend hands the batch to that worker. Results come
back per item and complete the task's future once every item has one.

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
batches of 64.
"""

from __future__ import annotations

import concurrent.futures
import heapq
import itertools
import math
import os
import threading
import time
from collections import deque
from typing import Any, Callable, Deque, List, Optional, Sequence, Tuple

from .config import BatchingConfig
from .errors import QueueFullError, StreamerClosedError, StreamerTimeoutError, WorkerDiedError
from .green import green_waiter, in_unpatched_greenlet, wait_green
from .oom import CostCap
from .stats import ModelStats

__all__ = ["BatchFuture", "Scheduler", "HoldPolicy", "Outcome"]

#: A per-item result: ``(True, value)`` or ``(False, exception)``.
Outcome = Tuple[bool, Any]

# Share of the model's recent service time that a free worker stays idle
# waiting for callers it has just answered to come back; past it, it goes on
# waiting only while they are still arriving (each within _STILL_ARRIVING of
# the last), up to _MAX_PATIENCE_SHARE.
_PATIENCE_SHARE = 0.25
_MAX_PATIENCE_SHARE = 0.5
_MIN_PATIENCE = 0.001
_STILL_ARRIVING = 0.001
# Weight of the newest sample in the running estimates of a batch's service
# time and of how long answered callers take to come back.
_SERVICE_EWMA = 0.2
# Patience covers this much more than the callers' recent time to come back,
# the slowest of the last few deliveries (each older one counts for less).
_RETURN_MARGIN = 1.25
_COMEBACK_DECAY = 0.9
# At most this share of a batch's time is spent waiting for callers known to
# come back: a batch run without them would make them wait a whole batch.
_COMEBACK_SHARE = 1.0
# A batch shaped by cost is chosen among the next this many batches' worth of
# waiting inputs: enough to find like companions, few enough to sort each time.
_SHAPING_WINDOW = 8
# Slack on top of a call's deadline before ``BatchFuture.result()`` gives up on
# its own; the dispatcher normally fails an overdue call right at the deadline.
_RESULT_GRACE = 1.0


# What Future.__init__ would make, made by BatchFuture on first use instead;
# under this lock, so that a completion and a first use do not interleave.
_LAZY_PARTS = frozenset(("_condition", "_waiters", "_done_callbacks"))
_LAZY_LOCK = threading.Lock()
_CANCELLED_STATES = frozenset(("CANCELLED", "CANCELLED_AND_NOTIFIED"))
_DONE_STATES = _CANCELLED_STATES | {"FINISHED"}


def _new_lock_after_fork() -> None:
    # Held by a thread of the parent at the fork (completing a call), it would stay held here.
    global _LAZY_LOCK
    _LAZY_LOCK = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_new_lock_after_fork)


class BatchFuture(concurrent.futures.Future[List[Any]]):
    """The future of one ``submit(batch)`` call; its result is a list, one
    output per input, in input order.

    It is a :class:`concurrent.futures.Future`, so ``wait``, ``as_completed``
    and ``asyncio.wrap_future`` work with it. Two differences: ``result()``
    without a timeout still returns by the call's deadline, and when
    ``result(timeout)`` runs out the call is given up, so its items are dropped
    before they reach the model, and :class:`StreamerTimeoutError` is raised.

    A waiting caller blocks on one lock that completion releases, rather than
    on the Future's condition: the condition is still held by the completing
    thread when it notifies, so the woken caller would block again at once.
    That second wake-up per call is what limits a thread-per-request server.
    And that condition, with the lists of waiters and callbacks, is made
    only when something needs it (``wait``, ``as_completed``, a callback, a
    cancel): most calls complete without ever making one.
    """

    _deadline: float = float("inf")
    #: Where the call's outcome is counted (set by the scheduler).
    _stats: Optional[ModelStats] = None
    #: Wakes a greenlet waiting in :meth:`result` under unpatched gevent.
    _green_wake: Optional[Callable[[], None]] = None
    #: Called once the call ends other than by its results (an error, a
    #: timeout, a cancel); maybe more than once, so it must be idempotent.
    #: A backend's cheaper done-callback: adding a real one makes the
    #: future's condition, and takes its slow path, on every call.
    _unanswered: Optional[Callable[[], None]] = None

    def __init__(self) -> None:
        # Not Future.__init__: its condition and lists are made on first use
        # (__getattr__), which most calls never reach: a completion that
        # finds no condition sets the result under _LAZY_LOCK alone.
        self._state = "PENDING"
        self._result = None
        self._exception = None
        self._finished = threading.Lock()
        self._finished.acquire()

    def __getattr__(self, name: str) -> Any:
        if name not in _LAZY_PARTS:
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        parts = self.__dict__
        with _LAZY_LOCK:
            if "_condition" not in parts:
                parts["_waiters"], parts["_done_callbacks"] = [], []
                parts["_condition"] = threading.Condition()
        return parts[name]

    def done(self) -> bool:
        return self._state in _DONE_STATES

    def cancelled(self) -> bool:
        return self._state in _CANCELLED_STATES

    def running(self) -> bool:
        return self._state == "RUNNING"

    def set_result(self, result: Any) -> None:
        super().set_result(result)
        self._wake()

    def set_exception(self, exception: Optional[BaseException]) -> None:
        super().set_exception(exception)
        stats = self._stats
        if stats is not None and exception is not None:
            stats.failed(exception)  # counted before the caller wakes to read the numbers
        self._ended_unanswered()
        self._wake()

    def _ended_unanswered(self) -> None:
        hook = self._unanswered
        if hook is not None:
            hook()

    def _set_quietly(self, result: Any) -> bool:
        """Complete the future but leave its waiter asleep until
        :meth:`_wake`: a batch's results are all set before any caller wakes
        to compete with the delivering thread."""
        with _LAZY_LOCK:
            if "_condition" not in self.__dict__:  # nobody waits on it, nor has a callback: no notifying
                if self._state != "PENDING":
                    return False
                self._result, self._state = result, "FINISHED"
                return True
        try:
            super().set_result(result)
        except concurrent.futures.InvalidStateError:
            return False
        return True

    def _wake(self) -> None:
        """Let the waiting caller (a thread, or a greenlet) return."""
        self._finished.release()
        green_wake = self._green_wake
        if green_wake is not None:
            green_wake()

    def cancel(self) -> bool:
        return self._cancel("cancelled")

    def _cancel(self, outcome: str) -> bool:
        with self._condition:
            if self._state not in ("PENDING", "RUNNING"):
                return self._state in _CANCELLED_STATES
            cancelled = super().cancel()
        if cancelled:
            # As an executor does for a cancelled item: concurrent.futures.wait()
            # and as_completed() count only a "notified" cancel as done.
            self.set_running_or_notify_cancel()
            stats = self._stats
            if stats is not None:
                stats.finished(outcome)
            self._ended_unanswered()
            self._wake()
        return cancelled

    def _wait_green(self, timeout: float) -> bool:
        """Yield to the gevent hub until done or ``timeout`` seconds pass;
        return whether done. :meth:`_wake` wakes the greenlet directly;
        a second greenlet waiting on the same call goes by a done-callback."""
        wake, waiter = green_waiter()
        if self._green_wake is None:
            self._green_wake = wake
        else:
            self.add_done_callback(lambda _done: wake())
        # Completed before the hook was in place: _wake did not see it.
        if not self.done():
            wait_green(waiter, timeout)
        return self.done()

    def result(self, timeout: Optional[float] = None) -> List[Any]:
        self._wait(timeout)
        result = self._result
        if self._state == "FINISHED" and self._exception is None and result is not None:
            return result  # the common case, without the condition's lock
        return super().result(0)

    def exception(self, timeout: Optional[float] = None) -> Optional[BaseException]:
        self._wait(timeout)
        return super().exception(0)

    def _wait(self, timeout: Optional[float]) -> None:
        if self._state in _DONE_STATES:
            return
        # Never longer than the call may take (the dispatcher fails it at its
        # deadline), which also keeps a huge timeout from overflowing the wait.
        longest = max(0.0, self._deadline - time.monotonic()) + _RESULT_GRACE
        timeout = longest if timeout is None else min(timeout, longest)
        if in_unpatched_greenlet():  # gevent without monkey-patching: yield to the hub
            if self._wait_green(max(0.0, timeout)):
                return
        elif self._finished.acquire(timeout=max(0.0, timeout)):
            self._finished.release()  # let any other waiter through too
            return
        if self._cancel("timeout"):
            raise StreamerTimeoutError(f"no result within {timeout:.3g}s; the call was given up")
        # It finished just as we gave up: its result (or error) stands.


def settle(future: concurrent.futures.Future[Any], exc: Optional[BaseException] = None, result: Any = None) -> bool:
    """Complete ``future`` unless it is done already (cancelled, timed out);
    return whether this call completed it."""
    try:
        if exc is not None:
            future.set_exception(exc)
        else:
            future.set_result(result)
    except concurrent.futures.InvalidStateError:
        return False
    return True


class _Task:
    """One ``submit()`` call: its future and the results gathered so far.

    Results are written by one delivery thread per backend; failures
    (timeouts, close) may come from other threads, which is why a completion
    may find the future done already and must not fail then (:func:`settle`,
    ``_set_quietly``).
    """

    __slots__ = ("future", "results", "remaining", "size", "timeout")

    def __init__(self, future: BatchFuture, size: int, timeout: float) -> None:
        self.future: Optional[BatchFuture] = future
        self.results: Optional[List[Any]] = [None] * size
        self.remaining = size
        self.size = size
        self.timeout = timeout

    def live(self) -> bool:
        future = self.future
        return future is not None and future._state == "PENDING"

    def fail(self, exc: BaseException) -> bool:
        future = self.future
        if future is None:
            return False
        self.future = self.results = None  # drop references: nothing stays in memory for it
        return settle(future, exc=exc)

    def set_outcome(self, index: int, ok: bool, value: Any) -> Optional[BatchFuture]:
        """Record one item's outcome; return the future if this completed it
        with its results (its waiter still to be woken), else ``None``."""
        future, results = self.future, self.results
        if future is None or results is None or future._state != "PENDING":
            return None
        if not ok:
            self.fail(value)
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

    __slots__ = ("task", "index", "value", "arrival", "crashes", "cost")

    def __init__(self, task: _Task, index: int, value: Any, arrival: float, cost: float = 1.0) -> None:
        self.task = task
        self.index = index
        self.value = value
        self.arrival = arrival
        self.crashes = 0
        self.cost = cost


def batch_cost(rule: str, costs: Sequence[float]) -> float:
    """What a batch of inputs of these ``costs`` costs: its length times the
    costliest (``"max"``: the model pads to the longest) or their sum."""
    return len(costs) * max(costs) if rule == "max" else float(sum(costs))


def shape_batch(costs: Sequence[float], size: int, budget: float, rule: str, grouped: bool) -> List[int]:
    """Which of the waiting inputs (their ``costs``, oldest first) make the
    next batch, by index: the oldest, then, when ``grouped``, those closest
    to it in cost (else the next in line), each taken if the batch stays
    within ``size`` inputs and costs at most ``budget`` by ``rule`` (see
    :func:`batch_cost`). The oldest always goes, alone if it is over the
    budget by itself, so no input waits behind a stream of others. Shared
    by the in-process scheduler and the Redis worker."""
    if not costs:
        return []
    lead = costs[0]
    if lead > budget:
        return [0]  # over the budget by itself: it runs alone
    order: Sequence[int] = range(1, len(costs))
    if grouped:
        order = sorted(order, key=lambda i: abs(costs[i] - lead))  # stable: ties by arrival
    taken = [0]
    padded = rule == "max"
    top = total = lead
    for i in order:
        if len(taken) >= size:
            break
        cost = costs[i]
        after = (len(taken) + 1) * max(top, cost) if padded else total + cost
        if after > budget:
            continue  # a cheaper one further on may still fit
        taken.append(i)
        top, total = max(top, cost), total + cost
    return taken


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
        if stats is not None:
            stats.succeeded(len(completed))  # counted before the callers wake to read the numbers
    for future in completed:
        future._wake()


class _Deadlines:
    """Call deadlines, soonest first. Calls on the streamer's own timeout
    arrive in deadline order, so they take a FIFO (O(1) a call); only calls
    with a timeout of their own go through a heap. Finished calls stay until
    their deadline and are swept out when the records grow, so memory
    follows the calls still running."""

    def __init__(self, standard_timeout: float) -> None:
        self.standard = standard_timeout
        self._fifo: Deque[Tuple[float, _Task]] = deque()
        self._heap: List[Tuple[float, int, _Task]] = []
        self._seq = itertools.count()
        self._sweep_at = 4096

    def add(self, deadline: float, task: _Task) -> bool:
        """Record ``task``; return whether its deadline is now the soonest."""
        if len(self._fifo) + len(self._heap) >= self._sweep_at:
            self._sweep()
        if task.timeout == self.standard:
            self._fifo.append((deadline, task))
            return len(self._fifo) == 1 and (not self._heap or deadline < self._heap[0][0])
        heapq.heappush(self._heap, (deadline, next(self._seq), task))
        return self._heap[0][2] is task and (not self._fifo or deadline < self._fifo[0][0])

    def pop_expired(self, now: float) -> List[_Task]:
        expired = []
        fifo, heap = self._fifo, self._heap
        while fifo and fifo[0][0] <= now:
            expired.append(fifo.popleft()[1])
        while heap and heap[0][0] <= now:
            expired.append(heapq.heappop(heap)[2])
        return expired

    def soonest(self) -> float:
        first = self._fifo[0][0] if self._fifo else float("inf")
        return min(first, self._heap[0][0]) if self._heap else first

    def tasks(self) -> List[_Task]:
        return [task for _, task in self._fifo] + [entry[2] for entry in self._heap]

    def clear(self) -> None:
        self._fifo.clear()
        self._heap.clear()

    def _sweep(self) -> None:
        self._fifo = deque(entry for entry in self._fifo if entry[1].future is not None)
        self._heap = [entry for entry in self._heap if entry[2].future is not None]
        heapq.heapify(self._heap)
        self._sweep_at = max(4096, 2 * (len(self._fifo) + len(self._heap)))


class HoldPolicy:
    """When a free worker should stop waiting for companions.

    Shared by the in-process :class:`Scheduler` and the Redis worker. The
    caller reports arrivals and deliveries; :meth:`hold_until` says until when
    a partial batch whose oldest item arrived at ``oldest`` may still wait:
    never past ``oldest + max_latency``, and only while callers just answered
    are expected back (see the module docstring).
    """

    __slots__ = ("max_latency", "due", "last_delivery", "last_arrival", "service", "comeback", "_awaited")

    def __init__(self, max_latency: float) -> None:
        self.max_latency = max_latency
        self.due = 0  # callers answered recently and expected back
        self.last_delivery = float("-inf")
        self.last_arrival = float("-inf")
        self.service: Optional[float] = None  # running estimate of one batch's time, seconds
        # How long after answering n callers n new inputs have arrived, lately,
        # seconds: the callers' round trip (longer through a broker than
        # in-process), which patience must cover to be worth it.
        self.comeback: Optional[float] = None
        self._awaited = 0  # inputs still to arrive before the comeback is measured

    def arrived(self, n: int, now: float) -> int:
        """``n`` inputs arrived; return how many answered callers are still due."""
        self.last_arrival = now
        if self.due:
            self.due = max(0, self.due - n)
        if self._awaited > 0:
            self._awaited -= n
            if self._awaited <= 0:
                # The slow returns matter (a large batch's callers take longest
                # to come back), and holding ends anyway once those due are back.
                sample = now - self.last_delivery
                comeback = self.comeback
                self.comeback = sample if comeback is None else max(sample, _COMEBACK_DECAY * comeback)
        return self.due

    def delivered(self, n: int, seconds: float, now: float) -> None:
        """A batch of ``n`` inputs that ran for ``seconds`` is being answered."""
        service = self.service
        self.service = seconds if service is None else service + _SERVICE_EWMA * (seconds - service)
        if now - self.last_delivery > _MAX_PATIENCE_SHARE * self.service:
            self.due = 0
        self.due += n
        self.last_delivery = now
        self._awaited = n

    def hold_until(self, oldest: float, now: float) -> float:
        """Until when to wait for companions; a time ``<= now`` means go now."""
        return min(oldest + self.max_latency, self._returners_until(now))

    def _returners_until(self, now: float) -> float:
        if self.due <= 0 or self.service is None:
            return float("-inf")
        patience = max(_MIN_PATIENCE, _PATIENCE_SHARE * self.service)
        if self.comeback is not None:  # callers take longer than that to come back: wait for them, within bounds
            patience = max(patience, min(_COMEBACK_SHARE * self.service, _RETURN_MARGIN * self.comeback))
        longest = self.last_delivery + max(patience, _MAX_PATIENCE_SHARE * self.service)
        until = min(longest, max(self.last_delivery + patience, self.last_arrival + _STILL_ARRIVING))
        if now >= until:
            self.due = 0
            return float("-inf")
        return until


class Scheduler:
    """The FIFO queue of items, the batching rule, and call deadlines.

    Backends report worker capacity with :meth:`add_slot`,
    :meth:`batch_done`, :meth:`batch_returned` and :meth:`worker_lost`; the
    dispatcher thread calls :meth:`next_batch`, which returns only while a
    worker has room. The dispatcher also fails calls whose deadline passed,
    wherever their items are (queued or on a worker), so a ``submit()`` future
    always completes.
    """

    def __init__(self, config: BatchingConfig, max_item_crashes: int = 2, stats: Optional[ModelStats] = None) -> None:
        self._config = config
        #: Where calls and batches are counted; backends record model calls here.
        self.stats = stats
        self._max_item_crashes = max_item_crashes
        self._cond = threading.Condition(threading.Lock())
        self._queue: Deque[_Item] = deque()
        self._alone: Deque[_Item] = deque()  # items to run one at a time after a worker crash
        self._dead = 0  # items in _queue whose task is done, roughly: triggers compaction
        self._deadlines = _Deadlines(config.timeout)
        # Worker capacity: each worker holds up to two batches, the one it runs
        # and, when a full batch is waiting, the next one, so it never idles
        # between batches under load.
        self._idle = 0  # workers holding no batch
        self._busy = 0  # workers holding one batch (room for a full one more)
        self._in_flight = 0  # batches handed out and not yet done or lost
        self._policy = HoldPolicy(config.max_latency)
        # Batches are shaped by cost when the config asks, and while a cap
        # learned from running out of memory holds (on the count, without
        # an item_cost: each input costs 1).
        if config.max_batch_cost is not None:
            ceiling = config.max_batch_cost
        else:
            ceiling = math.inf if config.item_cost is not None else float(config.batch_size)
        self._cap = CostCap(ceiling)
        self._shaped = config.shapes_by_cost
        self._closing = False
        self._stopped = False
        self._broken: Optional[Callable[[], BaseException]] = None

    # -- the callers' side -------------------------------------------------

    def put(self, values: Sequence[Any], timeout: float, costs: Optional[Sequence[float]] = None) -> BatchFuture:
        """Queue one call's inputs (already encoded by the backend), with
        their costs when the streamer has an ``item_cost``."""
        future = BatchFuture()
        future._stats = self.stats
        n = len(values)
        now = time.monotonic()
        future._deadline = deadline = now + timeout
        task = _Task(future, n, timeout)
        if costs is not None:
            items: Sequence[_Item] = [_Item(task, i, v, now, c) for i, (v, c) in enumerate(zip(values, costs))]
        elif n == 1:
            items = (_Item(task, 0, values[0], now),)
        else:
            items = [_Item(task, i, v, now) for i, v in enumerate(values)]
        cond = self._cond
        with cond:
            if self._closing:
                raise StreamerClosedError("this streamer is closed; create a new one to make more calls")
            if self._broken is not None:
                raise self._broken()
            queue = self._queue
            limit = self._config.max_queue
            if limit is not None and len(queue) + n > limit:
                self._compact()
                if len(queue) + n > limit:
                    raise QueueFullError(
                        f"the queue holds {len(queue)} items and max_queue is {limit}: "
                        "retry later, add workers, or raise max_queue"
                    )
            was_empty = not queue
            queue.extend(items)
            if self._deadlines.add(deadline, task):
                cond.notify()  # sooner than the deadline the dispatcher sleeps until
            due = self._policy.arrived(n, now)
            full = len(queue) >= self._config.batch_size or (self._shaped and self._over_budget())
            if (self._idle > 0 and (was_empty or due == 0 or full)) or (full and self._busy > 0):
                cond.notify()
        return future

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
                if self._idle > 0:
                    batch, hold_until = self._decide(now)
                    if batch:
                        self._handed(0)
                        return batch, 0
                    wake = min(wake, hold_until)
                elif self._busy > 0 and self._full_batch_waiting():
                    batch = self._take()
                    if batch:
                        self._handed(1)
                        return batch, 1
                cond.wait(None if wake == float("inf") else max(0.0, wake - now))

    def _handed(self, held: int) -> None:
        self._count(held, -1)
        self._count(held + 1, +1)
        self._in_flight += 1

    def _count(self, held: int, delta: int) -> None:
        if held == 0:
            self._idle += delta
        elif held == 1:
            self._busy += delta

    def _skip_given_up(self) -> Deque[_Item]:
        """The queue, after dropping given-up items at its head."""
        queue = self._queue
        while queue and not queue[0].task.live():
            queue.popleft()
        return queue

    def _full_batch_waiting(self) -> bool:
        queue = self._skip_given_up()
        return len(queue) >= self._config.batch_size or (self._shaped and bool(queue) and self._over_budget())

    def _over_budget(self) -> bool:
        """Whether the queued inputs are more than one batch's budget: a batch
        is as full as it can be. Called only with fewer than ``batch_size``
        inputs queued, so it looks at fewer than ``batch_size``."""
        budget = self._cap.budget(self._config.max_batch_cost)
        if math.isinf(budget):
            return False
        live = [item.cost for item in self._queue if item.task.live()]
        return bool(live) and batch_cost(self._config.batch_cost, live) > budget

    def _decide(self, now: float) -> Tuple[Optional[List[_Item]], float]:
        """With a free worker: the batch to run now, or when to look again."""
        alone = self._alone
        while alone:
            item = alone.popleft()
            if item.task.live():
                return [item], now
        queue = self._skip_given_up()
        if not queue:
            self._dead = 0
            return None, float("inf")
        if len(queue) >= self._config.batch_size or self._closing or (self._shaped and self._over_budget()):
            return self._take(), now
        hold_until = self._policy.hold_until(queue[0].arrival, now)
        if now >= hold_until:
            return self._take(), now
        return None, hold_until

    def _take(self) -> List[_Item]:
        """The next batch: the oldest inputs, or shaped by cost."""
        if self._shaped:
            return self._pop_shaped()
        return self._pop(self._config.batch_size)

    def _pop_shaped(self) -> List[_Item]:
        """A batch led by the oldest waiting input, shaped by
        :func:`shape_batch` from the next ``_SHAPING_WINDOW`` batches' worth
        of waiting inputs."""
        config = self._config
        queue = self._skip_given_up()
        window: List[_Item] = []
        room = _SHAPING_WINDOW * config.batch_size
        while queue and len(window) < room:
            item = queue.popleft()
            if item.task.live():
                window.append(item)
        taken = shape_batch(
            [item.cost for item in window],
            config.batch_size,
            self._cap.budget(config.max_batch_cost),
            config.batch_cost,
            grouped=config.item_cost is not None,
        )
        chosen = set(taken)
        queue.extendleft(reversed([item for i, item in enumerate(window) if i not in chosen]))
        return [window[i] for i in taken]

    def _pop(self, size: int) -> List[_Item]:
        queue = self._queue
        batch: List[_Item] = []
        while queue and len(batch) < size:
            item = queue.popleft()
            if item.task.live():
                batch.append(item)
        return batch

    # -- deadlines -----------------------------------------------------------

    def _expire(self, now: float) -> float:
        """Fail every call past its deadline; return the next deadline."""
        expired = 0
        for task in self._deadlines.pop_expired(now):
            if task.future is not None:
                expired += task.size
                task.fail(StreamerTimeoutError(f"the call did not finish within its timeout of {task.timeout:.3g}s"))
        if expired:
            self._dead += expired
            if self._dead * 2 > len(self._queue):
                self._compact()
        return self._deadlines.soonest()

    def _compact(self) -> None:
        self._queue = deque(item for item in self._queue if item.task.live())
        self._alone = deque(item for item in self._alone if item.task.live())
        self._dead = 0

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
        :class:`~streamer_core.oom.CostCap`)."""
        cap = self._cap
        if not out_of_memory and not cap.active:
            return  # the common case: no lock taken, no list made
        if oom_splits and self.stats is not None:
            self.stats.oom_split(oom_splits)
        costs = [item.cost for item in items]
        with self._cond:
            cap.learn(costs, self._config.batch_cost, out_of_memory, ran)
            self._shaped = self._config.shapes_by_cost or cap.active

    @property
    def cost_cap(self) -> float:
        """The cap on a batch's cost learned from running out of memory (``inf``: none)."""
        return self._cap.limit

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
                self._policy.delivered(size, seconds, time.monotonic())
            self._cond.notify_all()

    def callers_returning(self, now: float) -> bool:
        """Whether callers answered lately are still coming back: some are
        due, and one came back (or they were answered) within the last
        millisecond."""
        with self._cond:
            policy = self._policy
            return policy.due > 0 and now - max(policy.last_arrival, policy.last_delivery) < _STILL_ARRIVING

    def answered(self, n: int, seconds: float) -> None:
        """``n`` calls passed on elsewhere (to a broker) are being answered,
        ``seconds`` after they arrived: their callers are expected back, as
        after :meth:`batch_done`, for backends whose batches end before
        their answers come."""
        with self._cond:
            self._policy.delivered(n, seconds, time.monotonic())

    def batch_returned(self, items: Sequence[_Item], held: int) -> None:
        """A batch meant for a worker holding ``held`` batches could not be
        handed to it (it died meanwhile): queue the items again, first."""
        with self._cond:
            self._queue.extendleft(reversed(items))
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
            self._queue.extendleft(reversed([item for items in unstarted for item in items if item.task.live()]))
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
                        self._alone.append(item)
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
        """Refuse new calls; queued ones are still dispatched, without waiting
        for companions."""
        with self._cond:
            self._closing = True
            self._cond.notify_all()

    def wait_drained(self, deadline: float) -> bool:
        """Wait until nothing is queued or running, or ``deadline`` passes."""
        with self._cond:
            while self._queue or self._alone or self._in_flight > 0:
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
        for item in itertools.chain(self._queue, self._alone):
            if item.task.future is not None:
                item.task.fail(make_error())
        self._deadlines.clear()
        self._queue.clear()
        self._alone.clear()
        self._dead = 0

    def queued(self) -> int:
        """Items waiting for a worker (calls given up may still be counted)."""
        with self._cond:
            return len(self._queue) + len(self._alone)
