"""What a read of a model's numbers gives: :class:`StreamerStats` (with
its :class:`Histogram` and, per priority level, :class:`PriorityStats`),
and the names and buckets they are counted by. Values only: the counting
itself is :mod:`streamer_core.telemetry.stats`, which re-exports all of these."""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

__all__ = [
    "BATCH_SIZE_BUCKETS",
    "DROP_REASONS",
    "Histogram",
    "OUTCOMES",
    "PriorityStats",
    "SECONDS_BUCKETS",
    "StreamerStats",
]

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
class PriorityStats:
    """One priority level's numbers in this process (see
    :attr:`StreamerStats.priorities`): ``priority`` (1 the highest), its
    calls by outcome, its inputs' queue waits, and its inputs waiting now."""

    priority: int
    requests: Dict[str, int]
    queue_wait_seconds: Histogram
    queue_depth: int


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
    ``priorities``: with priority levels, each level's numbers, level 1
    first (:class:`PriorityStats`); empty for a model of one level.
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
    priorities: Tuple[PriorityStats, ...] = ()

    @property
    def batches(self) -> int:
        """Model calls run."""
        return self.batch_size.count

    @property
    def mean_batch_size(self) -> Optional[float]:
        """Inputs per model call, on average; ``None`` before the first."""
        return self.batch_size.mean
