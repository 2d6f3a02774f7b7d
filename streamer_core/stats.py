"""What every streamer counts as it runs, per model, in plain Python.

Each model name (a Flask route's endpoint, a Django ``MODELS`` key, a bare
streamer's ``name``) has one :class:`ModelStats` per process, shared by every
streamer of that name the process has started: counters survive a streamer
being closed and started again (after a fork, say), as Prometheus expects of
counters. Recording is a few integer additions per batch and one per input,
under a lock no caller waits on for long; :mod:`streamer_core.metrics` reads
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
  model ran out of memory on them (see :mod:`streamer_core.oom`), by
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
"""

from __future__ import annotations

import bisect
import logging
import math
import os
import threading
import weakref
from dataclasses import dataclass, field
from typing import Callable, Dict, Iterable, List, Optional, Protocol, Tuple

from .errors import (
    ItemCostError,
    QueueFullError,
    SerializationError,
    StreamerClosedError,
    StreamerTimeoutError,
    UnavailableError,
)

__all__ = [
    "OUTCOMES",
    "DROP_REASONS",
    "Histogram",
    "ModelStats",
    "StreamerStats",
    "outcome_of",
    "stats_for",
    "all_stats",
    "export_new_stats",
]

logger = logging.getLogger("streamer_core.stats")

#: How a call can end. ``model_error``: the model raised for one of its inputs
#: (or its worker died on it); ``rejected``: the queue was full; ``unavailable``:
#: no worker, no broker, or the streamer closing; ``invalid``: the input could
#: not be read or sent (HTTP 400, or 415 for a body of a type the route does
#: not read); ``too_large``: a body, file or list of inputs over the route's
#: limit (HTTP 413); ``cancelled``: the caller gave it up.
OUTCOMES = ("ok", "model_error", "timeout", "rejected", "unavailable", "invalid", "too_large", "cancelled")

#: Why an input was dropped before it ran: ``cancelled``: its call was
#: cancelled (``future.cancel()``, a cancelled ``apredict`` task) or ended
#: otherwise first (another of its inputs failed; over Redis, any
#: withdrawal by the web process, which the worker cannot tell apart);
#: ``expired``: its deadline passed (the call's timeout, or a caller's wait
#: in ``result(timeout)`` ran out); ``disconnected``: the HTTP client went
#: away while the request waited (see the README's "Callers who leave").
DROP_REASONS = ("cancelled", "expired", "disconnected")

#: Histogram bucket upper bounds. Batch sizes in powers of two (a batch of 64
#: is counted at ``le="64"``); seconds from half a millisecond to half a minute.
BATCH_SIZE_BUCKETS: Tuple[float, ...] = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
SECONDS_BUCKETS: Tuple[float, ...] = (
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
)


def outcome_of(exc: BaseException) -> str:
    """The outcome label of a call that failed with ``exc``."""
    if isinstance(exc, StreamerTimeoutError):
        return "timeout"
    if isinstance(exc, QueueFullError):
        return "rejected"
    if isinstance(exc, (UnavailableError, StreamerClosedError)):
        return "unavailable"
    if isinstance(exc, (ItemCostError, SerializationError)):
        return "invalid"
    status = getattr(exc, "status", 500)  # the web layers' InvalidInput: a 4xx
    if isinstance(status, int) and status < 500:
        return "too_large" if status == 413 else "invalid"
    return "model_error"


@dataclass(frozen=True)
class Histogram:
    """Counts of observations per bucket: ``counts[i]`` fell at or below
    ``bounds[i]`` and above the bound before it; the last count is above every
    bound. ``sum`` is the total of the observed values."""

    bounds: Tuple[float, ...]
    counts: Tuple[int, ...]
    sum: float

    @property
    def count(self) -> int:
        """How many values were observed."""
        return sum(self.counts)

    @property
    def mean(self) -> Optional[float]:
        """Their mean, or ``None`` before the first."""
        count = self.count
        return self.sum / count if count else None

    def cumulative(self) -> List[Tuple[float, int]]:
        """``(upper bound, values at or below it)`` pairs, ending with ``inf``:
        Prometheus's ``le`` buckets."""
        pairs, running = [], 0
        for bound, count in zip((*self.bounds, float("inf")), self.counts):
            running += count
            pairs.append((bound, running))
        return pairs


class _Buckets:
    """A histogram being recorded; the owner's lock is held around writes."""

    __slots__ = ("bounds", "counts", "sum")

    def __init__(self, bounds: Tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.sum += value

    def frozen(self) -> Histogram:
        return Histogram(self.bounds, tuple(self.counts), self.sum)


@dataclass(frozen=True)
class StreamerStats:
    """A snapshot of one model's numbers in this process; see
    :meth:`BaseStreamer.stats`.

    ``requests`` counts calls by outcome (every name of :data:`OUTCOMES` is
    present); ``batch_size`` (inputs per model call), ``queue_wait_seconds``
    (per input, arrival to the start of its model call) and ``model_seconds``
    (per model call) are histograms; ``queue_depth`` is how many inputs wait
    now and ``workers_live`` how many workers can take batches now, over
    every streamer of this name the process runs. With the Redis backend a
    web process counts calls and the queue, its workers count batches.
    ``oom_splits`` counts batches (or parts of one) split in halves because
    the model ran out of memory on them, and ``batch_cost_cap`` is the cap
    on a batch's cost learned from that now (``inf``: none; in inputs for a
    streamer without ``item_cost``), the lowest of this name's streamers.
    ``workers_by_device`` splits the live workers by device, as the logs name
    it (``default``: none given). A Redis web process's live workers are
    those Redis knows, by the device each worker wrote there, asked as the
    snapshot is taken. ``redelivered`` counts requests a Redis worker took over from one that
    stopped answering, ``dead_lettered`` entries that did not parse and went
    to the Redis dead-letter stream (both 0 on the other backends).
    ``dropped`` counts inputs taken out unrun because nobody waited for
    them any more, by reason (every name of :data:`DROP_REASONS` is present).
    """

    model: str
    requests: Dict[str, int]
    batch_size: Histogram
    queue_wait_seconds: Histogram
    model_seconds: Histogram
    queue_depth: int
    workers_live: int
    oom_splits: int
    batch_cost_cap: float
    redelivered: int = 0
    dead_lettered: int = 0
    workers_by_device: Dict[str, int] = field(default_factory=dict)
    dropped: Dict[str, int] = field(default_factory=lambda: dict.fromkeys(DROP_REASONS, 0))

    @property
    def batches(self) -> int:
        """Model calls run."""
        return self.batch_size.count

    @property
    def mean_batch_size(self) -> Optional[float]:
        """Inputs per model call, on average; ``None`` before the first."""
        return self.batch_size.mean


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


class ModelStats:
    """The numbers of one model name in this process (see the module
    docstring). Backends record through :meth:`batch_ran`; futures and
    ``submit`` through :meth:`finished` and :meth:`succeeded`."""

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
        self._mirror: Optional[Callable[..., None]] = None  # see streamer_core.metrics

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
        with self._lock:
            sources = list(self._brokers)
        pending: Optional[int] = None
        for source in sources:
            try:
                count = source.pending_requests()
            except Exception as exc:
                logger.debug("no pending count of %s from its broker: %s", self.model, exc)
                return None
            pending = count if pending is None else max(pending, count)
        return pending

    def broker_workers(self) -> Optional[Dict[str, int]]:
        """The workers of this name serving now by device, as their broker
        knows them, asked of it now (the Redis backend's: every web process
        sees the same workers, none of them its own); ``None`` without a
        broker streamer or when the broker does not answer (logged at debug,
        as for :meth:`broker_pending`). The most among this name's streamers
        (they share their workers when they share a prefix: not added up)."""
        with self._lock:
            sources = list(self._brokers)
        found: Optional[Dict[str, int]] = None
        for source in sources:
            try:
                devices = source.live_workers_by_device()
            except Exception as exc:
                logger.debug("no live workers of %s from its broker: %s", self.model, exc)
                return None
            if found is None or sum(devices.values()) > sum(found.values()):
                found = devices
        return found

    def batch_ran(self, started: float, seconds: float, arrivals: Iterable[float]) -> None:
        """A model call of the inputs that arrived at ``arrivals`` (monotonic
        times) started at ``started`` and ran for ``seconds``."""
        waits = [max(0.0, started - arrival) for arrival in arrivals]
        with self._lock:
            self._batch_size.observe(len(waits))
            self._model_seconds.observe(seconds)
            observe = self._queue_wait.observe
            for wait in waits:
                observe(wait)
        mirror = self._mirror
        if mirror is not None:
            mirror(self, "batch", len(waits), seconds, waits)

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
        with self._lock:
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
    is made (:mod:`streamer_core.metrics` exports each to Prometheus)."""
    with _registry_lock:
        _exporters.append(exporter)
        made = list(_registry.values())
    for stats in made:
        exporter(stats)


def all_stats() -> List[ModelStats]:
    """Every model's numbers in this process, by name."""
    with _registry_lock:
        return [_registry[name] for name in sorted(_registry)]
