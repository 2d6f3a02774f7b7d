"""The public face shared by every streamer: submit, predict, close.

A streamer is a :class:`~streamer_core.batching.scheduler.Scheduler` (the queue and the
batching rule), a dispatcher thread that takes batches from it whenever a
worker is free, and a backend that owns the workers (a thread, spawned
processes). The streamer object itself is referenced by none of its threads:
dropping it without ``close()`` still stops them, through a finalizer.

Threads and worker processes do not survive ``fork()``. A streamer made
before a server forks its workers (gunicorn ``--preload``, uWSGI without
``--lazy-apps``: a module-level streamer, as service_streamer's README has
it) finds in each forked process an engine whose threads are not there: it
starts its own there on first use, and leaves the parent's to the parent
(it never stops them, nor lets ``multiprocessing`` stop them as the forked
process exits).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import threading
import time
import weakref
from typing import Any, Callable, Dict, Iterable, List, Optional, Tuple

from .batching.calls import Item
from .batching.scheduler import Scheduler
from .errors import ItemCostError, StreamerClosedError, StreamerError
from .future import BatchFuture
from .options.config import BatchingConfig, check_cost, check_seconds, checked
from .telemetry.stats import ModelStats, StreamerStats, stats_for
from .telemetry.tracing import capture
from .threads import background

__all__ = ["BaseStreamer", "Backend"]

logger = logging.getLogger("streamer_core")

DEFAULT_CLOSE_TIMEOUT = 10.0

# How many times this process was forked into (counted in the child): a
# streamer whose count is older was started in a parent.
_forks = 0
# The engines a fork left in this process, held so that nothing of them runs
# here (their finalizers, a shared-memory pool given back): they are the parent's.
_inherited: List[_Engine] = []
_restart_lock = threading.Lock()


def _after_fork_in_child() -> None:
    global _forks, _restart_lock
    _forks += 1
    _restart_lock = threading.Lock()  # one held by another thread at the fork would stay held here


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def forks() -> int:
    """How many times this process was forked into (counted in the child):
    a count kept from before a fork is older in the child. Cheaper to ask
    on every request than ``os.getpid()``, a system call."""
    return _forks


class Backend:
    """What a backend provides to the engine. Subclasses own their workers."""

    name = "backend"
    #: Whether inputs are encoded (copied) before they are queued; when not,
    #: ``encode`` is never called.
    copies_inputs = False
    #: Whether the scheduler's batches are the model's, whose times tell
    #: which inputs could not be answered in time (see :mod:`.batching`).
    sheds_late = True

    def start(self, scheduler: Scheduler) -> None:
        """Start the workers; report each one ready with ``scheduler.add_slot()``."""
        raise NotImplementedError

    def encode(self, value: Any, index: int) -> Any:
        """Turn one input into what is queued and sent to a worker. Raises
        ``SerializationError`` for an input that cannot cross to the workers."""
        return value

    def run(self, items: List[Item], held: int) -> None:
        """Hand a batch to a worker that holds ``held`` batches already (0 or
        1), without blocking on the model. When no such worker is left (it
        died meanwhile), give the batch back with ``scheduler.batch_returned``."""
        raise NotImplementedError

    def wait_ready(self, timeout: float) -> bool:
        return True

    def workers_now(self) -> int:
        """How many of this process's workers can take a batch now (the Redis
        backend: none; the workers Redis knows are asked of it when the stats
        are read, :meth:`~streamer_core.telemetry.stats.ModelStats.broker_workers`)."""
        return 1

    def workers_by_device(self) -> Dict[str, int]:
        """:meth:`workers_now` by device, as the logs name it (``default``:
        none given); a device whose workers are all down counts 0. None
        from a backend whose workers count themselves (Redis's, each in its
        own metrics)."""
        return {}

    def waiting(self) -> int:
        """Inputs handed to the backend and not answered yet, beyond those
        the scheduler holds (the Redis backend's, sent to Redis)."""
        return 0

    def waiting_by_level(self, levels: int) -> List[int]:
        """:meth:`waiting` at each of ``levels`` priority levels, the highest first."""
        return [0] * levels

    def stop(self, deadline: float) -> None:
        """Stop every worker, by ``deadline`` (a ``time.monotonic()`` value) if
        they do not stop by themselves."""
        raise NotImplementedError


def item_costs(item_cost: Callable[[Any], float], inputs: List[Any]) -> List[float]:
    """The cost of each input, by ``item_cost``: see :func:`item_cost_of`."""
    return [item_cost_of(item_cost, value, index) for index, value in enumerate(inputs)]


def item_cost_of(item_cost: Callable[[Any], float], value: Any, index: int = 0) -> float:
    """The cost of input ``index`` of a call, by ``item_cost``. Raises
    :class:`ItemCostError` naming the input at fault when it raises or
    returns anything but a positive number: that call is refused, no other
    is touched."""
    try:
        cost = item_cost(value)
    except Exception as exc:
        raise ItemCostError(
            f"item_cost {callable_name(item_cost)} raised {type(exc).__name__} for input {index}: {exc}"
        ) from exc
    try:
        return check_cost(cost)
    except (TypeError, ValueError) as exc:  # named only then: it runs for every input
        raise ItemCostError(f"item_cost {callable_name(item_cost)} of input {index} {exc}") from None


class _Engine:
    """Everything a streamer runs, kept apart from the streamer object so the
    finalizer can close it after the object is gone."""

    def __init__(self, config: BatchingConfig, backend: Backend, max_item_crashes: int, stats: ModelStats) -> None:
        self.config = config
        self.backend = backend
        self.scheduler = Scheduler(config, max_item_crashes, stats, backend.sheds_late)
        self._close_lock = threading.Lock()
        self.closed = False
        backend.start(self.scheduler)
        self._dispatcher = background(self._dispatch, f"streamer-{backend.name}-dispatch")
        self._dispatcher.start()

    def gauges(self) -> Tuple[int, int]:
        """``(inputs queued, workers live)``, for the stats."""
        if self.closed:
            return 0, 0
        return self.scheduler.queued() + self.backend.waiting(), self.backend.workers_now()

    def levels_waiting(self) -> List[int]:
        """Inputs waiting at each priority level, the highest first, for the stats."""
        if self.closed:
            return []
        queued = self.scheduler.queued_by_level()
        return [n + m for n, m in zip(queued, self.backend.waiting_by_level(len(queued)))]

    def cost_cap(self) -> float:
        """The cap on a batch's cost learned from running out of memory, for the stats."""
        return self.scheduler.cost_cap

    def devices(self) -> Dict[str, int]:
        """Workers live now by device, for the stats."""
        return {} if self.closed else self.backend.workers_by_device()

    def _dispatch(self) -> None:
        scheduler, backend = self.scheduler, self.backend
        while True:
            handout = scheduler.next_batch()
            if handout is None:
                return
            batch, held = handout
            try:
                backend.run(batch, held)
            except BaseException as exc:  # never let the dispatcher die silently
                logger.exception("could not hand a batch to the %s backend", backend.name)
                for item in batch:
                    item.task.fail(StreamerError(f"could not hand the batch to a worker: {exc!r}"))
                scheduler.batch_returned([], held)

    def close(self, timeout: float) -> None:
        with self._close_lock:
            if self.closed:
                return
            self.closed = True
        deadline = time.monotonic() + timeout
        self.scheduler.begin_close()
        drained = self.scheduler.wait_drained(deadline)  # a broker's answers too: every call pending waits
        if not drained:
            logger.warning(
                "streamer closed with calls unfinished after %.3gs; they fail with StreamerClosedError", timeout
            )
        self.scheduler.stop(lambda: StreamerClosedError("the streamer was closed before this call finished"))
        self._dispatcher.join(max(0.0, deadline - time.monotonic()) + 1.0)
        self.backend.stop(max(deadline, time.monotonic() + 1.0))


def _close_in_owner(engine: _Engine, pid: int) -> None:
    """A dropped streamer's finalizer: close its engine, in the process that
    started it only (a forked process inherits the finalizer, not the workers)."""
    if os.getpid() == pid:
        engine.close(2.0)


class BaseStreamer:
    """Methods every streamer has; see :class:`ThreadedStreamer` and
    :class:`Streamer` for how to make one."""

    def __init__(
        self,
        config: BatchingConfig,
        make_backend: Callable[[], Backend],
        *,
        max_item_crashes: int = 2,
        name: Optional[str] = None,
    ) -> None:
        self._config = config
        self._stats = stats_for(self._default_name() if name is None else name)
        if config.priority_levels > 1:
            self._stats.use_levels(config.priority_levels)
        self._make_backend = make_backend  # called again in a forked process
        self._max_item_crashes = max_item_crashes
        self._start_engine()

    def _start_engine(self) -> None:
        engine = _Engine(self._config, self._make_backend(), self._max_item_crashes, self._stats)
        self._current, self._forks, self._pid = engine, _forks, os.getpid()
        self._finalizer = weakref.finalize(self, _close_in_owner, engine, self._pid)
        # The engine, not the streamer: the stats must not keep it alive.
        self._stats.watch(engine)

    @property
    def _engine(self) -> _Engine:
        """This process's engine: in a process forked after it started,
        started again there on first use (see the module's doc)."""
        if self._forks != _forks:
            self._after_fork(restart=True)
        return self._current

    def _after_fork(self, restart: bool) -> None:
        """Leave the engine this process inherited to the parent that runs
        it; start one of this process's own when ``restart`` (and the
        inherited one was not closed), else refuse calls from now on. The
        inherited engine is left as it came until then, so that a start
        that fails is tried again, and a process forked from this one sees
        what this one saw."""
        with _restart_lock:
            if self._forks == _forks:
                return  # another thread did it
            inherited = self._current
            if not any(engine is inherited for engine in _inherited):
                _inherited.append(inherited)
            self._finalizer.detach()
            self._stats.unwatch(inherited)
            if inherited.closed or not restart:
                inherited.closed = True  # this process's copy only
                self._forks = _forks
                return
            logger.warning(
                "%s %r was started in process %d, and this process (%d) was forked from it after: its "
                "threads (and any worker processes) run in that one, not here, so this one starts its own. To "
                "start them once per process, make the streamer after the fork (gunicorn without --preload, "
                "uWSGI with --lazy-apps, or the Flask and Django layers, which start streamers in each process)",
                type(self).__name__,
                self.name,
                self._pid,
                os.getpid(),
            )
            self._start_engine()

    def _default_name(self) -> str:
        return type(self).__name__

    @property
    def name(self) -> str:
        """The model's name in :meth:`stats` and the metrics' ``model`` label."""
        return self._stats.model

    def stats(self) -> StreamerStats:
        """This model's numbers in this process so far: calls by outcome,
        batch sizes, queue waits and model seconds (histograms), the inputs
        queued and the workers live now. Every streamer of the same ``name``
        in the process adds to the same numbers; see :mod:`streamer_core.telemetry.stats`."""
        return self._stats.snapshot()

    def live_workers(self) -> int:
        """How many workers can take a batch now (the thread backend: 1)."""
        return 0 if self._engine.closed else self._engine.backend.workers_now()

    def why_not_ready(self) -> Optional[str]:
        """``None`` when a call made now can be served (a worker is ready);
        otherwise why not, in words, for a readiness probe."""
        engine = self._engine
        if engine.closed:
            return "the streamer is closed"
        if engine.scheduler.broken:
            return "no worker can start: the model failed to load (see the log)"
        if self.live_workers() < 1:
            return "no worker is ready yet: the model is loading"
        return None

    @property
    def config(self) -> BatchingConfig:
        """The validated batching configuration this streamer runs with."""
        return self._config

    def submit(
        self, batch: Iterable[Any], timeout: Optional[float] = None, priority: Optional[int] = None
    ) -> BatchFuture:
        """Queue ``batch`` (a list of inputs) and return a future of its list of
        results, in input order. Its items may be spread over several model
        calls. ``timeout`` (seconds) defaults to the streamer's ``timeout``
        (its ``priority_timeout`` of the call's level, when set).
        ``priority``: the call's level, 1 the highest, up to
        ``priority_levels``; default ``default_priority``, else the lowest
        (see :mod:`streamer_core.batching.levels`).

        Raises at once: :class:`QueueFullError` when ``max_queue`` (of the
        call's level) is reached, :class:`StreamerClosedError` after ``close()``,
        :class:`SerializationError` for an input that cannot reach a worker
        process, :class:`WorkerStartError` when no worker can start;
        ``ValueError`` for a ``priority`` that is not a level.
        """
        config = self._config
        level = 0 if priority is None and config.priority_levels == 1 else config.level_of(priority)
        return self._submit(batch, config.call_timeout(timeout, level), level)

    def _submit(self, batch: Iterable[Any], call_timeout: float, level: int = 0) -> BatchFuture:
        """:meth:`submit` with its timeout and level checked already."""
        engine = self._engine
        if isinstance(batch, (str, bytes)):
            raise TypeError(
                f"submit() and predict() take a list of inputs, got a {type(batch).__name__}; "
                "wrap a single input in a list: predict([x])[0]"
            )
        inputs = batch if isinstance(batch, list) else list(batch)
        try:
            if engine.closed:
                raise StreamerClosedError("this streamer is closed; create a new one to make more calls")
            self._admit(inputs, level)
            costs = item_costs(self._config.item_cost, inputs) if self._config.item_cost is not None else None
            if engine.backend.copies_inputs:
                encode = engine.backend.encode
                values = [encode(value, index) for index, value in enumerate(inputs)]
            else:
                values = inputs
            if not values:
                future = BatchFuture()
                future.set_result([])
                return future
            trace = capture() if self._config.tracing else None
            return engine.scheduler.put(values, call_timeout, costs, trace, level)
        except StreamerError as exc:  # refused before it was queued
            self._stats.at(level).failed(exc)
            raise

    def _admit(self, inputs: List[Any], level: int = 0) -> None:
        """Refuse a call at priority ``level`` (0 the highest) before its
        inputs are costed and queued, by raising a :class:`StreamerError`
        (counted as the call's outcome); a backend's streamer adds its own
        checks here."""

    def predict(
        self, batch: Iterable[Any], timeout: Optional[float] = None, priority: Optional[int] = None
    ) -> List[Any]:
        """Run ``batch`` through the model and return its results in order;
        block until then. Raises the model's own exception if it failed on one
        of these inputs, :class:`StreamerTimeoutError` after ``timeout``
        seconds (default: the streamer's ``timeout``), and the errors of
        :meth:`submit`, which says what ``priority`` is."""
        config = self._config
        level = 0 if priority is None and config.priority_levels == 1 else config.level_of(priority)
        call_timeout = config.call_timeout(timeout, level)
        return self._submit(batch, call_timeout, level).result(call_timeout)

    async def apredict(
        self, batch: Iterable[Any], timeout: Optional[float] = None, priority: Optional[int] = None
    ) -> List[Any]:
        """:meth:`predict` for ``async`` code: awaits the result without
        blocking the event loop. Cancelling the awaiting task gives the call up."""
        future = self.submit(batch, timeout, priority)
        return await asyncio.wrap_future(future)

    def wait_ready(self, timeout: float = 60.0) -> bool:
        """Wait until every worker has started (the model is loaded); return
        whether they all did in time. Raises :class:`WorkerStartError` if none
        can start. Calls made before then simply queue."""
        return self._engine.backend.wait_ready(timeout)

    def queued(self) -> int:
        """How many inputs wait for a worker right now."""
        return self._engine.scheduler.queued()

    def close(self, timeout: float = DEFAULT_CLOSE_TIMEOUT) -> None:
        """Stop taking calls, finish those already queued or running for up to
        ``timeout`` seconds, fail the rest with :class:`StreamerClosedError`,
        and stop every thread and worker process. Safe to call twice."""
        # Checked before anything stops: a close that failed half-way would leave workers behind.
        timeout = checked("close's timeout", functools.partial(check_seconds, allow_zero=True), timeout)
        if self._forks != _forks:  # forked, and not used here since: nothing of it runs in this process
            self._after_fork(restart=False)
            return
        self._current.close(timeout)
        self._finalizer.detach()

    def destroy_workers(self) -> None:
        """service_streamer's name for :meth:`close`."""
        self.close()

    @property
    def closed(self) -> bool:
        return self._current.closed  # after a fork, the inherited engine's: the question starts nothing

    def __enter__(self) -> BaseStreamer:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()


def callable_name(obj: Any) -> str:
    return getattr(obj, "__qualname__", None) or getattr(obj, "__name__", None) or repr(obj)
