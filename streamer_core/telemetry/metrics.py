"""Prometheus metrics of every streamer in this process, through ``prometheus_client``.

Optional: with ``prometheus_client`` not installed nothing here is imported
and nothing is exported (the plain-Python numbers of
:mod:`streamer_core.telemetry.stats` are still kept). Installed, every model name gets,
with the label ``model``:

======================================  =========  ==============================================
``streamer_batch_size``                 histogram  inputs per model call
``streamer_queue_wait_seconds``         histogram  an input's arrival to the start of its call
``streamer_model_seconds``              histogram  one model call
``streamer_requests_total``             counter    calls, by ``outcome`` (see ``stats.OUTCOMES``)
``streamer_queue_depth``                gauge      inputs waiting now
``streamer_workers_live``               gauge      workers able to take a batch now (a Redis
                                                   web process: those Redis knows, asked at
                                                   each scrape; 0 while it does not answer)
``streamer_workers_live_by_device``     gauge      the same by ``device`` (``default``: none
                                                   given; no Redis sample while it does not
                                                   answer)
``streamer_oom_splits_total``           counter    batches (or parts) split because the model ran
                                                   out of memory on them
``streamer_batch_cost_cap``             gauge      the cap on a batch's cost learned from running
                                                   out of memory (``+Inf``: none; in inputs
                                                   without ``item_cost``); in multiprocess mode,
                                                   the lowest of the live processes'
``streamer_dropped_total``              counter    inputs taken out unrun because nobody waited
                                                   for them any more, by ``reason`` (see
                                                   ``stats.DROP_REASONS``)
``streamer_redis_redelivered_total``    counter    requests a Redis worker took over from one
                                                   that stopped answering
``streamer_redis_dead_lettered_total``  counter    entries that did not parse, moved to the
                                                   Redis dead-letter stream
``streamer_redis_pending``              gauge      requests delivered to a Redis worker and not
                                                   yet acknowledged, asked of Redis at each
                                                   scrape (no sample while it does not answer)
======================================  =========  ==============================================

A model with priority levels also has, with the labels ``model`` and
``priority`` (1 the highest), and only then (a model of one level has no
such series, and its other series are as they were):

============================================  =========  ========================================
``streamer_priority_requests_total``          counter    calls of the level, by ``outcome``
``streamer_priority_queue_wait_seconds``      histogram  its inputs' queue waits
``streamer_priority_queue_depth``             gauge      its inputs waiting now
============================================  =========  ========================================

In one process (the usual case) the numbers are read from
:mod:`streamer_core.telemetry.stats` when Prometheus scrapes, by a collector in
``prometheus_client``'s default registry: recording costs nothing more than
the plain-Python counting. Under several processes (gunicorn with several
workers, the Redis worker supervisor) set ``PROMETHEUS_MULTIPROC_DIR``, as
``prometheus_client``'s multiprocess mode asks, before the processes start:
each then writes its numbers to files there as it records them, and
:func:`exposition` adds up those of every process. The examples'
``gunicorn.conf.py`` set it by themselves with more than one worker
(:func:`streamer_core.web.gunicorn.on_starting`).

In multiprocess mode each gauge is combined over the live processes by the
rule that fits what one process reports: ``streamer_queue_depth`` and
``streamer_workers_live`` summed (each process has its own queue, and on
the thread and process backends its own workers), ``streamer_batch_cost_cap``
the lowest. The one-process collector (``_Collector``) is a custom
collector, which multiprocess mode cannot add up: it is not registered in
that mode, where every number is copied into ``prometheus_client``'s own
metric types as it is recorded (``_Mirrors``).

The broker's numbers are not theirs to add up: every web process on the
Redis backend sees the same workers and the same pending requests in Redis,
and a sum would count them once per process. So the files hold each
process's own workers only (a Redis web process has none), and the process
serving the scrape asks Redis for the rest (:class:`_Multiprocess`): the
pending requests, a family of their own, and the live workers (by device),
added to the files' samples of the same family, so that the exposition
holds each family once, whichever process answers. The workers' own metrics
(``--metrics-port``) count each worker once, by itself.
"""

from __future__ import annotations

import os
import threading
from typing import Any, Dict, Iterator, List, Optional, Set, Tuple

from ..threads import background
from .stats import (
    BATCH_SIZE_BUCKETS,
    DROP_REASONS,
    OUTCOMES,
    SECONDS_BUCKETS,
    ModelStats,
    StreamerStats,
    all_stats,
    export_new_stats,
)

__all__ = ["available", "exposition", "multiprocess_mode", "render"]
#: Seconds between two updates of a process's gauges in multiprocess mode.
GAUGE_PERIOD_S = 1.0

_install_lock = threading.Lock()
_installed = False
_mirrors: Optional[_Mirrors] = None


def available() -> bool:
    """Whether ``prometheus_client`` can be imported."""
    try:
        import prometheus_client  # noqa: F401
    except ImportError:
        return False
    return True


def multiprocess_mode() -> bool:
    """Whether ``prometheus_client``'s multiprocess mode is on (``PROMETHEUS_MULTIPROC_DIR`` set)."""
    return bool(os.environ.get("PROMETHEUS_MULTIPROC_DIR") or os.environ.get("prometheus_multiproc_dir"))


def install(stats: ModelStats) -> None:
    """Export ``stats`` (a new model's) to Prometheus, if ``prometheus_client``
    is installed: called by :func:`streamer_core.telemetry.stats.stats_for` for each
    model, once this module is imported (``streamer_core`` imports it)."""
    global _installed, _mirrors
    with _install_lock:
        if not _installed:
            _installed = True
            if not available():
                return
            if multiprocess_mode():
                _mirrors = _Mirrors()
            else:
                from prometheus_client import REGISTRY

                REGISTRY.register(_Collector())
        if _mirrors is not None:
            _mirrors.watch(stats)
            stats._mirror = _mirrors.record


def exposition() -> Tuple[bytes, str]:
    """This process's metrics (every process's, in multiprocess mode) in
    Prometheus's text format, and its media type, for a ``/metrics`` view.
    Raises ``RuntimeError`` saying what to install without ``prometheus_client``."""
    try:
        from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, CollectorRegistry, generate_latest
    except ImportError:
        raise RuntimeError(
            "metrics need prometheus_client: pip install 'streamer-core[metrics]' (or prometheus_client)"
        ) from None
    if multiprocess_mode():
        registry = CollectorRegistry()
        registry.register(_Multiprocess())
        return generate_latest(registry), CONTENT_TYPE_LATEST
    return generate_latest(REGISTRY), CONTENT_TYPE_LATEST


def render(snapshots: List[StreamerStats]) -> Iterator[Any]:
    """Metric families of these snapshots, for a ``prometheus_client`` collector."""
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

    histograms = [
        ("streamer_batch_size", "Inputs per model call.", "batch_size"),
        ("streamer_queue_wait_seconds", "Seconds from an input's arrival to the start of its model call.",
         "queue_wait_seconds"),
        ("streamer_model_seconds", "Seconds of one model call.", "model_seconds"),
    ]  # fmt: skip
    for name, help_text, field in histograms:
        family = HistogramMetricFamily(name, help_text, labels=["model"])
        for snap in snapshots:
            histogram = getattr(snap, field)
            buckets = [(_le(bound), float(count)) for bound, count in histogram.cumulative()]
            family.add_metric([snap.model], buckets, histogram.sum)
        yield family
    requests = CounterMetricFamily("streamer_requests", "Calls, by how they ended.", labels=["model", "outcome"])
    for snap in snapshots:
        for outcome in OUTCOMES:
            requests.add_metric([snap.model, outcome], float(snap.requests[outcome]))
    yield requests
    depth = GaugeMetricFamily("streamer_queue_depth", "Inputs waiting for a worker now.", labels=["model"])
    live = GaugeMetricFamily("streamer_workers_live", _LIVE_HELP, labels=["model"])
    for snap in snapshots:
        depth.add_metric([snap.model], float(snap.queue_depth))
        live.add_metric([snap.model], float(snap.workers_live))
    yield depth
    yield live
    by_device = GaugeMetricFamily("streamer_workers_live_by_device", _BY_DEVICE_HELP, labels=["model", "device"])
    for snap in snapshots:
        for device, count in sorted(snap.workers_by_device.items()):
            by_device.add_metric([snap.model, device], float(count))
    yield by_device
    splits = CounterMetricFamily(
        "streamer_oom_splits", "Batches or parts split because the model ran out of memory.", labels=["model"]
    )
    cap = GaugeMetricFamily(
        "streamer_batch_cost_cap", "The cap on a batch's cost learned from running out of memory.", labels=["model"]
    )
    for snap in snapshots:
        splits.add_metric([snap.model], float(snap.oom_splits))
        cap.add_metric([snap.model], snap.batch_cost_cap)
    yield splits
    yield cap
    dropped = CounterMetricFamily("streamer_dropped", _DROPPED_HELP, labels=["model", "reason"])
    for snap in snapshots:
        for reason in DROP_REASONS:
            dropped.add_metric([snap.model, reason], float(snap.dropped[reason]))
    yield dropped
    redelivered = CounterMetricFamily(
        "streamer_redis_redelivered",
        "Requests a Redis worker took over from a worker that stopped answering.",
        labels=["model"],
    )
    dead = CounterMetricFamily(
        "streamer_redis_dead_lettered", "Entries that did not parse, moved to the dead-letter stream.", labels=["model"]
    )
    for snap in snapshots:
        redelivered.add_metric([snap.model], float(snap.redelivered))
        dead.add_metric([snap.model], float(snap.dead_lettered))
    yield redelivered
    yield dead
    yield from _render_levels(snapshots)


def _render_levels(snapshots: List[StreamerStats]) -> Iterator[Any]:
    """The per-level families: samples of the models with priority levels only."""
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

    labels = ["model", "priority"]
    requests = CounterMetricFamily("streamer_priority_requests", _LEVEL_REQUESTS_HELP, labels=[*labels, "outcome"])
    waits = HistogramMetricFamily("streamer_priority_queue_wait_seconds", _LEVEL_WAIT_HELP, labels=labels)
    depth = GaugeMetricFamily("streamer_priority_queue_depth", _LEVEL_DEPTH_HELP, labels=labels)
    for snap in snapshots:
        for level in snap.priorities:
            priority = str(level.priority)
            for outcome in OUTCOMES:
                requests.add_metric([snap.model, priority, outcome], float(level.requests[outcome]))
            buckets = [(_le(bound), float(count)) for bound, count in level.queue_wait_seconds.cumulative()]
            waits.add_metric([snap.model, priority], buckets, level.queue_wait_seconds.sum)
            depth.add_metric([snap.model, priority], float(level.queue_depth))
    yield requests
    yield waits
    yield depth


_LEVEL_REQUESTS_HELP = "Calls of one priority level, by how they ended."
_LEVEL_WAIT_HELP = "Seconds from an input's arrival to the start of its model call, by priority level."
_LEVEL_DEPTH_HELP = "Inputs waiting for a worker now, by priority level."
_DROPPED_HELP = "Inputs taken out unrun because nobody waited for them any more, by reason."
_LIVE_HELP = "Workers able to take a batch now."
_BY_DEVICE_HELP = "Workers able to take a batch now, by device."


def render_pending(models: List[ModelStats]) -> Iterator[Any]:
    """The family of requests delivered to a Redis worker and not yet
    acknowledged, asked of Redis now for each of ``models`` that has a Redis
    streamer in this process (one XPENDING summary each). Read at the scrape,
    by the process serving it, rather than kept by each process: it is the
    broker's number, the same whichever web process asks."""
    from prometheus_client.core import GaugeMetricFamily

    pending = GaugeMetricFamily(
        "streamer_redis_pending", "Requests delivered to a Redis worker and not yet acknowledged.", labels=["model"]
    )
    for stats in models:
        count = stats.broker_pending()
        if count is not None:
            pending.add_metric([stats.model], float(count))
    yield pending


def _le(bound: float) -> str:
    return "+Inf" if bound == float("inf") else repr(float(bound))


class _Collector:
    """Reads every model's stats when Prometheus scrapes (one process)."""

    def collect(self) -> Iterator[Any]:
        models = all_stats()
        yield from render([stats.snapshot() for stats in models])
        yield from render_pending(models)

    def describe(self) -> List[Any]:
        return []  # no samples at registration: names are checked at scrape


class _Multiprocess:
    """Multiprocess mode: every process's numbers from the files of
    ``PROMETHEUS_MULTIPROC_DIR``, and the broker's, asked of Redis by the
    process serving the scrape (see the module's doc): the live workers it
    knows added to the files' samples of their family, the pending requests
    (:func:`render_pending`) a family of their own."""

    def __init__(self) -> None:
        from prometheus_client import multiprocess

        self._files = multiprocess.MultiProcessCollector(None)  # type: ignore[no-untyped-call]

    def collect(self) -> Iterator[Any]:
        models = all_stats()
        brokers = {stats.model: devices for stats in models if (devices := stats.broker_workers()) is not None}
        live: _Added = {(model,): sum(devices.values()) for model, devices in brokers.items()}
        by_device: _Added = {(model, device): n for model, devices in brokers.items() for device, n in devices.items()}
        merged: Dict[str, Tuple[str, Tuple[str, ...], _Added]] = {
            "streamer_workers_live": (_LIVE_HELP, ("model",), live),
            "streamer_workers_live_by_device": (_BY_DEVICE_HELP, ("model", "device"), by_device),
        }
        for family in self._files.collect():  # type: ignore[no-untyped-call]
            if family.name in merged:
                _, labels, added = merged.pop(family.name)
                _add_samples(family, labels, added)
            yield family
        for name, (help_text, labels, added) in merged.items():  # families no process has written yet
            if added:
                from prometheus_client.core import GaugeMetricFamily

                family = GaugeMetricFamily(name, help_text, labels=list(labels))
                _add_samples(family, labels, added)
                yield family
        yield from render_pending(models)

    def describe(self) -> List[Any]:
        return []


#: Workers to add, by the values of a family's labels.
_Added = Dict[Tuple[str, ...], int]


def _add_samples(family: Any, labels: Tuple[str, ...], added: _Added) -> None:
    """Add ``added`` (by label values, in the order of ``labels``) to the
    samples of ``family`` with those labels, and a sample for each that has none."""
    added = dict(added)
    samples = []
    for sample in family.samples:
        extra = added.pop(tuple(sample.labels.get(label) for label in labels), 0)
        samples.append(sample._replace(value=sample.value + extra) if extra else sample)
    family.samples = samples
    for values, count in added.items():
        family.add_sample(family.name, dict(zip(labels, values)), float(count))


class _Mirrors:
    """Multiprocess mode: ``prometheus_client`` metrics that every record is
    copied into as it is made (they write to ``PROMETHEUS_MULTIPROC_DIR``),
    and a thread that sets this process's gauges every :data:`GAUGE_PERIOD_S`."""

    def __init__(self) -> None:
        from prometheus_client import Counter, Gauge, Histogram

        self.batch_size = Histogram("streamer_batch_size", "Inputs per model call.", ["model"],
                                    buckets=BATCH_SIZE_BUCKETS)  # fmt: skip
        self.queue_wait = Histogram(
            "streamer_queue_wait_seconds",
            "Seconds from an input's arrival to the start of its model call.",
            ["model"],
            buckets=SECONDS_BUCKETS,
        )
        self.model_seconds = Histogram(
            "streamer_model_seconds", "Seconds of one model call.", ["model"], buckets=SECONDS_BUCKETS
        )
        self.requests = Counter("streamer_requests", "Calls, by how they ended.", ["model", "outcome"])
        self.depth = Gauge(
            "streamer_queue_depth", "Inputs waiting for a worker now.", ["model"], multiprocess_mode="livesum"
        )
        self.live = Gauge("streamer_workers_live", _LIVE_HELP, ["model"], multiprocess_mode="livesum")
        self.by_device = Gauge(
            "streamer_workers_live_by_device", _BY_DEVICE_HELP, ["model", "device"], multiprocess_mode="livesum"
        )
        self._devices_set: Dict[str, Set[str]] = {}  # by model: devices given a value, set to 0 once gone
        self._levels_made: Dict[str, int] = {}  # by model: levels whose samples exist
        self.oom_splits = Counter(
            "streamer_oom_splits", "Batches or parts split because the model ran out of memory.", ["model"]
        )
        self.cost_cap = Gauge(
            "streamer_batch_cost_cap",
            "The cap on a batch's cost learned from running out of memory.",
            ["model"],
            multiprocess_mode="livemin",
        )
        self.redelivered = Counter(
            "streamer_redis_redelivered",
            "Requests a Redis worker took over from a worker that stopped answering.",
            ["model"],
        )
        self.dead_lettered = Counter(
            "streamer_redis_dead_lettered", "Entries that did not parse, moved to the dead-letter stream.", ["model"]
        )
        self.dropped = Counter("streamer_dropped", _DROPPED_HELP, ["model", "reason"])
        self.level_requests = Counter("streamer_priority_requests", _LEVEL_REQUESTS_HELP,
                                      ["model", "priority", "outcome"])  # fmt: skip
        self.level_wait = Histogram("streamer_priority_queue_wait_seconds", _LEVEL_WAIT_HELP, ["model", "priority"],
                                    buckets=SECONDS_BUCKETS)  # fmt: skip
        self.level_depth = Gauge("streamer_priority_queue_depth", _LEVEL_DEPTH_HELP, ["model", "priority"],
                                 multiprocess_mode="livesum")  # fmt: skip
        self._watched: Dict[str, ModelStats] = {}
        # Each model's labelled children, looked up once (a lookup costs as
        # much as a record).
        self._children: Dict[str, Tuple[Any, Any, Any, Dict[str, Any], Any, Any, Any, Dict[str, Any]]] = {}
        self._lock = threading.Lock()
        self._thread: Optional[threading.Thread] = None
        self._pid = 0

    def watch(self, stats: ModelStats) -> None:
        model = stats.model
        with self._lock:
            self._watched[model] = stats
            self._children[model] = (
                self.batch_size.labels(model),
                self.model_seconds.labels(model),
                self.queue_wait.labels(model),
                {outcome: self.requests.labels(model, outcome) for outcome in OUTCOMES},  # each at 0 from the start
                self.oom_splits.labels(model),
                self.redelivered.labels(model),
                self.dead_lettered.labels(model),
                {reason: self.dropped.labels(model, reason) for reason in DROP_REASONS},
            )
            if self._thread is None or self._pid != os.getpid():
                self._pid = os.getpid()
                self._thread = background(self._gauges, "streamer-metrics-gauges")
                self._thread.start()
        self._set_gauges(stats)

    def record(self, stats: ModelStats, what: str, *args: Any) -> None:
        batch_size, model_seconds, queue_wait, requests, oom_splits, redelivered, dead_lettered, dropped = (
            self._children[stats.model]
        )
        if what == "batch":
            size, seconds, waits = args
            batch_size.observe(size)
            model_seconds.observe(seconds)
            observe = queue_wait.observe
            for wait in waits:
                observe(wait)
        elif what == "oom_splits":
            oom_splits.inc(args[0])
        elif what == "redelivered":
            redelivered.inc(args[0])
        elif what == "dead_lettered":
            dead_lettered.inc(args[0])
        elif what == "dropped":
            dropped[args[0]].inc(args[1])
        elif what == "level":  # a call of one level: (level, outcome, calls)
            self.level_requests.labels(stats.model, str(args[0] + 1), args[1]).inc(args[2])
        elif what == "level_waits":  # (levels, waits) of one batch
            for level, wait in zip(*args):
                self.level_wait.labels(stats.model, str(level + 1)).observe(wait)
        else:
            requests[what].inc(args[0])

    def _set_gauges(self, stats: ModelStats) -> None:
        queued, live, cap = stats.gauges()
        self.depth.labels(stats.model).set(queued)
        self.live.labels(stats.model).set(live)
        self.cost_cap.labels(stats.model).set(cap)
        devices = stats.devices()
        for device in self._devices_set.setdefault(stats.model, set()) - devices.keys():
            self.by_device.labels(stats.model, device).set(0)
        for device, count in devices.items():
            self.by_device.labels(stats.model, device).set(count)
        self._devices_set[stats.model].update(devices)
        depths = stats.levels_waiting()
        for level in range(self._levels_made.get(stats.model, 0) + 1, len(depths) + 1):
            # A new level's samples, at 0 from the start as in one process.
            for outcome in OUTCOMES:
                self.level_requests.labels(stats.model, str(level), outcome)
            self.level_wait.labels(stats.model, str(level))
            self._levels_made[stats.model] = level
        for level, depth in enumerate(depths, 1):
            self.level_depth.labels(stats.model, str(level)).set(depth)

    def _gauges(self) -> None:
        import time

        while True:
            time.sleep(GAUGE_PERIOD_S)
            with self._lock:
                watched = list(self._watched.values())
            for stats in watched:
                try:
                    self._set_gauges(stats)
                except Exception:  # never let a broker's hiccup end the thread
                    pass


export_new_stats(install)
