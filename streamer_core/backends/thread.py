"""The thread backend: the model runs on one thread of this process.

The simplest and fastest choice when the model releases the GIL while it
works (PyTorch, NumPy and most native libraries do) and one copy of it fits.
"""

from __future__ import annotations

import queue
import sys
import threading
import time
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Sequence, Tuple, cast

from ..batching.calls import Item, deliver, live_items
from ..batching.runner import BatchRun, run_batch
from ..batching.scheduler import Scheduler
from ..batching.shaping import batch_cost
from ..errors import WorkerDiedError
from ..managed_model import ManagedModel, model_facts, ready_line
from ..options.config import OPTIONS, BatchingConfig, BatchingOptions, default, shown_device
from ..streamer import Backend, BaseStreamer, callable_name, logger
from ..telemetry.tracing import BatchFacts, traced_run
from ..threads import background

if TYPE_CHECKING:
    from typing_extensions import Unpack

__all__ = ["ThreadedStreamer"]


class _Lane:
    """One of the model's threads and the batches handed to it: the one it
    runs and, under load, the next (see :class:`Scheduler`)."""

    __slots__ = ("inbox", "held", "thread")

    def __init__(self) -> None:
        self.inbox: queue.SimpleQueue[Optional[List[Item]]] = queue.SimpleQueue()
        self.held = 0  # batches handed to this thread and not finished
        self.thread: Optional[threading.Thread] = None


class _ThreadBackend(Backend):
    name = "thread"

    def __init__(
        self, predict: Callable[[List[Any]], Sequence[Any]], config: BatchingConfig, name: str, threads: int = 1
    ) -> None:
        self._predict = predict
        self._isolate = config.isolate_errors
        self._oom_errors = config.oom_errors
        self._cost_rule = config.batch_cost
        # What a batch's span says of it, when the streamer traces.
        self._facts: Optional[BatchFacts] = None
        if config.tracing:
            self._facts = BatchFacts(name, "thread", "thread", model_facts(predict, None).device)
        # One lane per model thread, each a slot of the scheduler's: a batch
        # goes to a thread holding as many batches as the scheduler counted
        # for the slot it chose.
        self._lanes = [_Lane() for _ in range(threads)]
        for i, lane in enumerate(self._lanes):
            lane.thread = background(self._loop, "streamer-thread-model" + (f"-{i}" if i else ""), (lane,))
        self._scheduler: Optional[Scheduler] = None
        self._lock = threading.Lock()  # the lanes' held counts

    def start(self, scheduler: Scheduler) -> None:
        self._scheduler = scheduler
        for lane in self._lanes:
            assert lane.thread is not None
            lane.thread.start()
            scheduler.add_slot()

    def run(self, items: List[Item], held: int) -> None:
        with self._lock:
            lane = next((lane for lane in self._lanes if lane.held == held), None)
            if lane is not None:
                lane.held += 1
        if lane is None:
            # The thread counted on finished a batch after this one was
            # formed and before it came here: the scheduler counts it anew
            # and hands the items out again, first.
            assert self._scheduler is not None
            self._scheduler.batch_returned(items, held)
            return
        lane.inbox.put(items)

    def _finished_one(self, lane: _Lane) -> int:
        with self._lock:
            lane.held -= 1
            return lane.held

    def _loop(self, lane: _Lane) -> None:
        scheduler = self._scheduler
        assert scheduler is not None
        predict = _off_the_hub(self._predict, len(self._lanes))
        isolate, oom_errors, inbox = self._isolate, self._oom_errors, lane.inbox
        stats, facts = scheduler.stats, self._facts
        while True:
            items = inbox.get()
            if items is None:
                return
            items = live_items(items, stats)  # given up while waiting for this thread
            if not items:
                scheduler.batch_done(0, 0.0, self._finished_one(lane))
                continue
            started = time.monotonic()
            try:
                if facts is None:
                    run = run_batch(predict, [item.value for item in items], isolate, oom_errors)
                else:
                    run = self._traced(facts, predict, items)
                outcomes = run.outcomes
                scheduler.learn(items, run.out_of_memory, run.ran, run.oom_splits)
            except BaseException as exc:  # SystemExit and the like: fail the batch, keep serving
                logger.exception("the model raised %r outside of its error isolation", exc)
                outcomes = [(False, _ended(exc))] * len(items)
            seconds = time.monotonic() - started
            scheduler.batch_done(len(items), seconds, self._finished_one(lane))
            if stats is not None:
                levels = [item.level for item in items] if stats.levels else None
                stats.batch_ran(started, seconds, [item.arrival for item in items], levels)
            deliver(items, outcomes)

    def _traced(self, facts: BatchFacts, predict: Callable[[List[Any]], Sequence[Any]], items: List[Item]) -> BatchRun:
        """:func:`run_batch` inside the batch's span (see :mod:`streamer_core.telemetry.tracing`;
        a batch of calls the sampler left out alone runs as an untraced one)."""
        values = [item.value for item in items]
        calls = [item.task.trace for item in items]
        cost = batch_cost(self._cost_rule, [item.cost for item in items])
        run, _ = traced_run(lambda: run_batch(predict, values, self._isolate, self._oom_errors), facts, calls, cost)
        return run

    def workers_now(self) -> int:
        return sum(1 for lane in self._lanes if lane.thread is not None and lane.thread.is_alive())

    def workers_by_device(self) -> Dict[str, int]:
        return {shown_device(None): self.workers_now()}  # the model's threads, on whichever device it chose

    def stop(self, deadline: float) -> None:
        for lane in self._lanes:
            lane.inbox.put(None)
        current = threading.current_thread()
        left = 0
        for lane in self._lanes:
            thread = lane.thread
            assert thread is not None
            if thread is not current:
                thread.join(max(0.0, deadline - time.monotonic()))
            left += thread.is_alive()
        if left == 1:
            logger.warning("the model thread is still inside the model; it is left to finish on its own")
        elif left:
            logger.warning("%d model threads are still inside the model; they are left to finish on their own", left)


def _ended(exc: BaseException) -> BaseException:
    """What the callers of a batch get when the model raised ``exc``: an
    exception that ends a thread (SystemExit, KeyboardInterrupt) is not
    raised again in theirs, where it would stop a caller's thread, or a
    server's worker whose request thread it reached, but reported as the
    process backend reports a worker that exited."""
    if isinstance(exc, Exception):
        return exc
    error = WorkerDiedError(f"the model raised {exc!r}, which ends the thread it runs in; this batch failed")
    error.__cause__ = exc
    return error


#: Threads of gevent's pool left to gevent's own calls (its resolver) beside the model's.
_GEVENT_OWN_THREADS = 4


def _off_the_hub(
    predict: Callable[[List[Any]], Sequence[Any]], threads: int = 1
) -> Callable[[List[Any]], Sequence[Any]]:
    """Under gevent's ``monkey.patch_all()`` the model "thread" is a greenlet,
    so a model call that computes (rather than sleeps) would stop the hub and
    every request with it. Run the calls on a real thread of gevent's pool
    instead; the greenlet waits cooperatively. What the model raises comes
    back as a value and is raised in the greenlet: raised on the pool's
    thread, gevent would also print its traceback to stderr, one for every
    bad input a client sends. The pool grows to hold the model's
    ``threads`` beside the few gevent keeps for its own (name lookups), so
    the batches run at once as many as asked."""
    monkey = sys.modules.get("gevent.monkey")
    if monkey is None or not monkey.is_module_patched("threading"):
        return predict
    import gevent

    pool = gevent.get_hub().threadpool
    if pool.maxsize < threads + _GEVENT_OWN_THREADS:
        pool.maxsize = threads + _GEVENT_OWN_THREADS

    def caught(batch: List[Any]) -> Tuple[Optional[BaseException], Any]:
        try:
            return None, predict(batch)
        except BaseException as exc:  # raised again in the greenlet, below
            return exc, None

    def on_pool_thread(batch: List[Any]) -> Sequence[Any]:
        error, outputs = pool.apply(caught, (batch,))
        if error is not None:
            raise error
        return cast(Sequence[Any], outputs)

    return on_pool_thread


class ThreadedStreamer(BaseStreamer):
    """Batch calls to ``predict_function`` on a thread of this process.

    ``predict_function(batch: list) -> list`` gets at most ``batch_size``
    inputs at a time. ``max_latency`` (seconds) bounds how long the oldest
    queued input waits for companions; a lone request does not wait when none
    are coming. Keyword-only options: ``timeout`` (seconds a call may take,
    default 20), ``max_queue`` (refuse calls past this many queued inputs,
    default no limit), ``isolate_errors`` (default True: when the model raises,
    only the inputs that cause it fail), and ``item_cost``, ``max_batch_cost``
    and ``batch_cost`` to shape batches by what their inputs cost (a text's
    tokens, say) rather than by count alone, and ``oom_errors``, the errors
    that mean out of memory: see :class:`BatchingConfig` (each option's
    default is in :data:`streamer_core.options.config.OPTIONS`); ``name`` is the
    model's name in :meth:`stats` and the metrics (default the function's).

    ``model_threads`` (default 1) runs that many batches at once, each on a
    thread of its own, calling the one ``predict_function``: for a model
    safe to call from several threads, as PyTorch's inference is. On a GPU
    one batch's tokenizing and copying then overlap another's forward pass;
    on a CPU, give each batch its share of the cores
    (``torch.set_num_threads(cores // model_threads)``), which a busy web
    process disturbs less than one batch spread over every core.

    Same signature as service_streamer's ``ThreadedStreamer``.
    """

    def __init__(
        self,
        predict_function: Callable[[List[Any]], Sequence[Any]],
        batch_size: int,
        max_latency: float = default("max_latency"),
        *,
        name: Optional[str] = None,
        model_threads: int = default("model_threads"),
        **options: Unpack[BatchingOptions],
    ) -> None:
        self._start_on(predict_function, BatchingConfig(batch_size, max_latency, **options), name, model_threads)

    @classmethod
    def from_config(
        cls,
        predict_function: Callable[[List[Any]], Sequence[Any]],
        config: BatchingConfig,
        *,
        name: Optional[str] = None,
        model_threads: int = default("model_threads"),
    ) -> ThreadedStreamer:
        """A streamer of ``config``, a :class:`BatchingConfig` made (and so
        checked) already: what the Flask and Django layers make from their settings."""
        streamer = cls.__new__(cls)
        streamer._start_on(predict_function, config, name, model_threads)
        return streamer

    def _start_on(
        self,
        predict_function: Callable[[List[Any]], Sequence[Any]],
        config: BatchingConfig,
        name: Optional[str],
        model_threads: int,
    ) -> None:
        threads = OPTIONS["model_threads"].checked(model_threads)
        predict = predict_function  # as given: the checks below narrow the name they test
        if isinstance(predict_function, type) and issubclass(predict_function, ManagedModel):
            raise TypeError(
                f"ThreadedStreamer takes a function, not the ManagedModel class {predict_function.__name__}: "
                "build the model and pass its predict method, or use Streamer to build it in worker processes"
            )
        if not callable(predict_function):
            raise TypeError(f"predict_function must be callable (a function taking a list), got {predict_function!r}")
        shown = callable_name(predict) if name is None else name
        super().__init__(config, lambda: _ThreadBackend(predict, config, self.name, threads), name=shown)
        facts = model_facts(predict, None)
        logger.info("thread backend: %s", ready_line(facts, config.batch_size, config.max_latency, threads))
