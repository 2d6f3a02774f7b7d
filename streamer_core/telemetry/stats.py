"""What every streamer counts as it runs, per model, in plain Python.

Each model name (a Flask route's endpoint, a Django ``MODELS`` key, a bare
streamer's ``name``) has one :class:`ModelStats` per process, shared by every
streamer of that name the process has started: counters survive a streamer
being closed and started again (after a fork, say), as Prometheus expects of
counters. Recording is a few integer additions per batch and one per input,
under a lock no caller waits on for long; :mod:`streamer_core.telemetry.metrics` reads
the same numbers for Prometheus, and :meth:`BaseStreamer.stats` returns them
as a :class:`StreamerStats` for people who do not use Prometheus.

What is counted, and where:

* ``requests``: calls, by outcome (see :data:`OUTCOMES`), when their future
  completes (``ok``: once per batch) or when ``submit`` refuses them;
* ``batch_size``, ``model_seconds``: once per model call, by the backend that
  ran it (the process backend's workers report the seconds to their parent;
  Redis workers count in their own process);
* ``queue_wait_seconds``: per input, from its arrival to the start of the
  model call that ran it;
* ``oom_splits``: batches (or parts of one) split in halves because the
  model ran out of memory on them (see :mod:`streamer_core.batching.oom`), by
  whoever learns from them: the web process for the thread and process
  backends (workers report their splits to it), each worker for Redis;
  ``batch_cost_cap``, the cap on a batch's cost learned from those errors,
  read from the live streamers;
* ``dropped``: inputs taken out unrun because nobody waited for them any
  more, by reason (see :data:`DROP_REASONS`), where they were dropped: in
  the web process for the thread and process backends, and for inputs a
  Redis web process had not sent yet; by the Redis worker that read them
  otherwise;
* ``redelivered`` (Redis workers): requests taken over from a worker that
  stopped answering; ``dead_lettered`` (Redis workers and web processes):
  entries that did not parse, moved to the dead-letter stream. Both stay 0
  on the other backends.

The Redis backend's requests delivered to a worker and not yet acknowledged,
and its live workers (by device), are not counted here but asked of Redis
when read (:meth:`ModelStats.broker_pending`, :meth:`ModelStats.broker_workers`):
they are the broker's numbers, the same whichever web process asks.

A model with priority levels (``priority_levels`` > 1) also has, per level
(:class:`PriorityStats`): its calls by outcome (a call counts at its level
once it has one: a request refused before, a bad ``X-Priority`` say,
counts for the model only), its inputs' queue waits, and its inputs
waiting now. A model of one level has none of these, and its numbers are
as they were.
"""

from __future__ import annotations

import logging
import math
import os
import threading
import weakref
from typing import Callable, Dict, Iterable, List, Optional, Protocol, Sequence, Tuple, TypeVar

from ..errors import (
    ClientDisconnected,
    ItemCostError,
    QueueFullError,
    SerializationError,
    StreamerClosedError,
    StreamerTimeoutError,
    UnavailableError,
)
from .snapshots import (
    BATCH_SIZE_BUCKETS,
    DROP_REASONS,
    OUTCOMES,
    SECONDS_BUCKETS,
    Histogram,
    PriorityStats,
    StreamerStats,
    _Buckets,
)

__all__ = [
    "BATCH_SIZE_BUCKETS",
    "SECONDS_BUCKETS",
    "OUTCOMES",
    "DROP_REASONS",
    "Histogram",
    "ModelStats",
    "StreamerStats",
    "PriorityStats",
    "outcome_of",
    "stats_for",
    "all_stats",
    "export_new_stats",
]

logger = logging.getLogger("streamer_core.telemetry.stats")
#: What a broker streamer is asked for (:meth:`ModelStats._most_of_brokers`).
B = TypeVar("B")


def outcome_of(exc: BaseException) -> str:
    """The outcome label of a call that failed with ``exc``."""
    if isinstance(exc, StreamerTimeoutError):
        return "timeout"
    if isinstance(exc, QueueFullError):
        return "rejected"
    if isinstance(exc, (UnavailableError, StreamerClosedError)):
        return "unavailable"
    if isinstance(exc, ClientDisconnected):
        return "cancelled"  # the client left before its body arrived, as one that leaves while it waits
    if isinstance(exc, (ItemCostError, SerializationError)):
        return "invalid"
    status = getattr(exc, "status", 500)  # the web layers' InvalidInput: a 4xx
    if isinstance(status, int) and status < 500:
        return "too_large" if status == 413 else "invalid"
    return "model_error"


class GaugeSource(Protocol):
    """Something whose present state counts in a model's gauges."""

    def gauges(self) -> Tuple[int, int]:
        """``(inputs queued, workers live)`` now."""
        ...

    def cost_cap(self) -> float:
        """The cap on a batch's cost learned from running out of memory (``inf``: none)."""
        ...

    def devices(self) -> Dict[str, int]:
        """Workers live now, by device (a device whose workers are down: 0)."""
        ...


class BrokerSource(Protocol):
    """A streamer whose requests wait in a broker, asked when metrics are read."""

    def pending_requests(self) -> int:
        """Requests delivered to a worker and not yet acknowledged, now
        (asks the broker; raises what the broker's client raises)."""
        ...

    def live_workers_by_device(self) -> Dict[str, int]:
        """The workers serving now, by device, as the broker knows them
        (asks the broker; raises what the broker's client raises)."""
        ...


class Level:
    """The numbers of one priority level of a model (``level`` 0 the
    highest). A call at that level counts its outcome through it (its
    future's stats): in the model's numbers and the level's alike."""

    __slots__ = ("model", "level", "requests", "queue_wait")
    #: Whether a batch's calls may count through different objects
    #: (see :func:`~streamer_core.batching.calls.deliver`).
    leveled = True

    def __init__(self, model: ModelStats, level: int) -> None:
        self.model = model
        self.level = level
        self.requests = dict.fromkeys(OUTCOMES, 0)
        self.queue_wait = _Buckets(SECONDS_BUCKETS)

    def finished(self, outcome: str, calls: int = 1) -> None:
        """``calls`` calls of this level ended with ``outcome``."""
        model = self.model
        with model._lock:
            model._requests[outcome] += calls
            self.requests[outcome] += calls
        mirror = model._mirror
        if mirror is not None:
            mirror(model, outcome, calls)
            mirror(model, "level", self.level, outcome, calls)

    def succeeded(self, calls: int) -> None:
        self.finished("ok", calls)

    def failed(self, exc: BaseException) -> None:
        self.finished(outcome_of(exc))


class ModelStats:
    """The numbers of one model name in this process (see the module
    docstring). Backends record through :meth:`batch_ran`; futures and
    ``submit`` through :meth:`finished` and :meth:`succeeded`."""

    #: A model's own numbers: every call of a batch counts through it alike.
    leveled = False

    def __init__(self, model: str) -> None:
        self.model = model
        self._lock = threading.Lock()
        self._requests = dict.fromkeys(OUTCOMES, 0)
        self._batch_size = _Buckets(BATCH_SIZE_BUCKETS)
        self._queue_wait = _Buckets(SECONDS_BUCKETS)
        self._model_seconds = _Buckets(SECONDS_BUCKETS)
        self._oom_splits = 0
        self._redelivered = 0
        self._dead_lettered = 0
        self._dropped = dict.fromkeys(DROP_REASONS, 0)
        # Live streamers of this name, read for the gauges; weak, so stats
        # never keep a streamer (or its model) alive.
        self._sources: weakref.WeakSet[GaugeSource] = weakref.WeakSet()
        self._brokers: weakref.WeakSet[BrokerSource] = weakref.WeakSet()
        self._mirror: Optional[Callable[..., None]] = None  # see streamer_core.telemetry.metrics
        #: With priority levels, each level's numbers, the highest first (see use_levels).
        self.levels: List[Level] = []

    def use_levels(self, count: int) -> None:
        """Count per priority level too, for ``count`` levels (a streamer or
        worker of that many levels starts): at least as many as any of this
        name's streamers has."""
        with self._lock:
            while len(self.levels) < count:
                self.levels.append(Level(self, len(self.levels)))

    def at(self, level: int) -> ModelStats | Level:
        """Where a call of priority ``level`` (0 the highest) counts its
        outcome: that level's numbers, or the model's alone where it has no
        levels."""
        levels = self.levels
        return levels[level] if levels else self

    def watch(self, source: GaugeSource) -> None:
        """Count ``source.gauges()`` in the queue depth and live workers
        while ``source`` lives and is not :meth:`unwatch`-ed."""
        with self._lock:
            self._sources.add(source)

    def unwatch(self, source: GaugeSource) -> None:
        with self._lock:
            self._sources.discard(source)

    def watch_broker(self, source: BrokerSource) -> None:
        """Ask ``source`` for :meth:`broker_pending` while it lives and is not
        :meth:`unwatch_broker`-ed."""
        with self._lock:
            self._brokers.add(source)

    def unwatch_broker(self, source: BrokerSource) -> None:
        with self._lock:
            self._brokers.discard(source)

    def broker_pending(self) -> Optional[int]:
        """Requests of this name delivered to a worker and not yet
        acknowledged, asked of the broker now; ``None`` without a broker
        streamer or when the broker does not answer (logged at debug: a
        scrape must not fail, nor flood the log, while Redis is away). The
        largest among this name's streamers, which share one requests stream
        when they share a prefix (they are not added up)."""
        return self._most_of_brokers(lambda source: source.pending_requests(), float, "pending count")

    def broker_workers(self) -> Optional[Dict[str, int]]:
        """The workers of this name serving now by device, as their broker
        knows them, asked of it now (the Redis backend's: every web process
        sees the same workers, none of them its own); ``None`` without a
        broker streamer or when the broker does not answer (logged at debug,
        as for :meth:`broker_pending`). The most among this name's streamers
        (they share their workers when they share a prefix: not added up)."""
        return self._most_of_brokers(
            lambda source: source.live_workers_by_device(), lambda devices: sum(devices.values()), "live workers"
        )

    def _most_of_brokers(self, ask: Callable[[BrokerSource], B], size: Callable[[B], float], what: str) -> Optional[B]:
        """What ``ask`` gets of each of this name's broker streamers, the
        largest by ``size``; ``None`` without one, or as soon as one does
        not answer (logged at debug as ``what``)."""
        with self._lock:
            sources = list(self._brokers)
        found: Optional[B] = None
        for source in sources:
            try:
                value = ask(source)
            except Exception as exc:
                logger.debug("no %s of %s from its broker: %s", what, self.model, exc)
                return None
            if found is None or size(value) > size(found):
                found = value
        return found

    def batch_ran(
        self, started: float, seconds: float, arrivals: Iterable[float], levels: Optional[Sequence[int]] = None
    ) -> None:
        """A model call of the inputs that arrived at ``arrivals`` (monotonic
        times) started at ``started`` and ran for ``seconds``; ``levels``:
        their priority levels, where the model has levels."""
        waits = [max(0.0, started - arrival) for arrival in arrivals]
        with self._lock:
            self._batch_size.observe(len(waits))
            self._model_seconds.observe(seconds)
            observe = self._queue_wait.observe
            for wait in waits:
                observe(wait)
            if levels is not None and self.levels:
                for level, wait in zip(levels, waits):
                    self.levels[level].queue_wait.observe(wait)
        mirror = self._mirror
        if mirror is not None:
            mirror(self, "batch", len(waits), seconds, waits)
            if levels is not None and self.levels:
                mirror(self, "level_waits", levels, waits)

    def oom_split(self, splits: int) -> None:
        """A model call ran out of memory and its batch was split in halves
        ``splits`` times (counting the splits of its parts)."""
        with self._lock:
            self._oom_splits += splits
        mirror = self._mirror
        if mirror is not None:
            mirror(self, "oom_splits", splits)

    def redelivered(self, requests: int = 1) -> None:
        """``requests`` requests were taken over from a worker that stopped answering."""
        with self._lock:
            self._redelivered += requests
        mirror = self._mirror
        if mirror is not None:
            mirror(self, "redelivered", requests)

    def dead_lettered(self, entries: int = 1) -> None:
        """``entries`` entries that did not parse went to the dead-letter stream."""
        with self._lock:
            self._dead_lettered += entries
        mirror = self._mirror
        if mirror is not None:
            mirror(self, "dead_lettered", entries)

    def dropped(self, reason: str, inputs: int = 1) -> None:
        """``inputs`` inputs were taken out unrun for ``reason`` (one of
        :data:`DROP_REASONS`): nobody waited for them any more."""
        with self._lock:
            self._dropped[reason] += inputs
        mirror = self._mirror
        if mirror is not None:
            mirror(self, "dropped", reason, inputs)

    def succeeded(self, calls: int) -> None:
        """``calls`` calls completed with their results."""
        with self._lock:
            self._requests["ok"] += calls
        mirror = self._mirror
        if mirror is not None:
            mirror(self, "ok", calls)

    def finished(self, outcome: str) -> None:
        """One call ended with ``outcome`` (one of :data:`OUTCOMES`)."""
        with self._lock:
            self._requests[outcome] += 1
        mirror = self._mirror
        if mirror is not None:
            mirror(self, outcome, 1)

    def failed(self, exc: BaseException) -> None:
        """One call failed with ``exc``."""
        self.finished(outcome_of(exc))

    def gauges(self) -> Tuple[int, int, float]:
        """``(inputs queued, workers live, batch cost cap)`` now, over this
        name's live streamers in this process, read in one pass: the sums of
        the first two, and the lowest cap on a batch's cost they have learned
        from running out of memory (``inf``: none). The workers are this
        process's own (the thread and process backends', a Redis worker
        itself), not those a broker knows (:meth:`broker_workers`)."""
        with self._lock:
            sources = list(self._sources)
        queued = live = 0
        cap = math.inf
        for source in sources:
            try:
                q, w = source.gauges()
            except Exception:  # a snapshot never fails on a source
                q, w = 0, 0
            queued, live = queued + q, live + w
            try:
                cap = min(cap, source.cost_cap())
            except Exception:  # as for the counts: a snapshot never fails on a source
                pass
        return queued, live, cap

    def levels_waiting(self) -> List[int]:
        """Inputs waiting now at each priority level, the highest first,
        added up over this name's live streamers (those of levels: a
        source's ``levels_waiting()``); empty for a model of one level."""
        count = len(self.levels)
        if not count:
            return []
        with self._lock:
            sources = list(self._sources)
        waiting = [0] * count
        for source in sources:
            try:
                each = source.levels_waiting()  # type: ignore[attr-defined]
            except Exception:  # a source of one level has none; a broker away counts for none
                continue
            for level, n in enumerate(each[:count]):
                waiting[level] += n
        return waiting

    def devices(self) -> Dict[str, int]:
        """This process's own workers live now by device, added up over this
        name's live streamers (a source that fails to say counts for none)."""
        with self._lock:
            sources = list(self._sources)
        counts: Dict[str, int] = {}
        for source in sources:
            try:
                devices = source.devices()
            except Exception:  # as for the gauges: a snapshot never fails on a source
                continue
            for device, live in devices.items():
                counts[device] = counts.get(device, 0) + live
        return counts

    def snapshot(self) -> StreamerStats:
        """The numbers now; its live workers are this process's own and
        those the broker knows (asked now: :meth:`broker_workers`)."""
        queued, live, cap = self.gauges()
        devices = self.devices()
        for device, count in (self.broker_workers() or {}).items():
            devices[device] = devices.get(device, 0) + count
            live += count
        depths = self.levels_waiting()
        with self._lock:
            priorities = tuple(
                PriorityStats(level.level + 1, dict(level.requests), level.queue_wait.frozen(), depth)
                for level, depth in zip(self.levels, depths)
            )
            return StreamerStats(
                self.model,
                dict(self._requests),
                self._batch_size.frozen(),
                self._queue_wait.frozen(),
                self._model_seconds.frozen(),
                queued,
                live,
                self._oom_splits,
                cap,
                self._redelivered,
                self._dead_lettered,
                devices,
                dict(self._dropped),
                priorities,
            )


_registry: Dict[str, ModelStats] = {}
_registry_lock = threading.Lock()
_exporters: List[Callable[[ModelStats], None]] = []


def _new_locks_after_fork() -> None:
    """In a forked process: a lock another thread of the parent held at the
    fork would stay held here for good (a streamer started again in the
    forked process counts into the same numbers)."""
    global _registry_lock
    _registry_lock = threading.Lock()
    for stats in _registry.values():
        stats._lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_new_locks_after_fork)


def stats_for(model: str) -> ModelStats:
    """This process's :class:`ModelStats` of ``model``, made on first use.
    Raises ``TypeError`` for a name that is not a non-empty string."""
    if not isinstance(model, str) or not model:
        raise TypeError(f"name must be a non-empty string (the model label of its metrics), got {model!r}")
    stats = _registry.get(model)
    if stats is not None:
        return stats
    with _registry_lock:
        stats = _registry.get(model)
        if stats is None:
            stats = _registry[model] = ModelStats(model)
            for exporter in _exporters:
                exporter(stats)
    return stats


def export_new_stats(exporter: Callable[[ModelStats], None]) -> None:
    """Have ``exporter`` called with every model's :class:`ModelStats` as it
    is made (:mod:`streamer_core.telemetry.metrics` exports each to Prometheus)."""
    with _registry_lock:
        _exporters.append(exporter)
        made = list(_registry.values())
    for stats in made:
        exporter(stats)


def all_stats() -> List[ModelStats]:
    """Every model's numbers in this process, by name."""
    with _registry_lock:
        return [_registry[name] for name in sorted(_registry)]
