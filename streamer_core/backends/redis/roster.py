"""The workers of a prefix as a web process sees them: how many are live
(they beat within ``PRESENCE_MS``) and on which devices, when one was last
seen, and which are still loading their model.

With ``require_workers`` (as the Flask and Django layers make a
:class:`~streamer_core.RedisStreamer`), calls are refused at once while no
worker has been live for :data:`NO_WORKER_S` seconds, rather than left to
wait out their timeout in Redis: a :class:`NoWorkerError` (503) that says
which it is. Workers that have not been started: start them. Workers that
announced themselves and are loading their model (a worker says so as it
starts, see :class:`~.presence.Loading`): the model is loading, try again in
as long as it has loaded so far (the ``Retry-After``), at most
:data:`LONGEST_RETRY_AFTER_S`.

With priority levels each level has a stream, and a worker reads the
streams of the levels it was started with (it says how many in its info;
a worker of a version before levels, or started with one, reads only the
first). A web process of several levels learns, with each check, the most
levels a live worker reads: with ``require_workers`` a call at a level no
live worker reads is refused at once (a :class:`NoWorkerError` saying to
start the workers with the levels), rather than left to wait out its
timeout in a stream nobody reads; without it, the call waits there, and a
warning says why.

Only the time Redis could be asked counts: while it cannot be reached (a
restart, a failover) nothing is known of the workers, who lose it too, and
calls fail with :class:`~streamer_core.BrokerUnavailableError` instead (the
sends say so). Once Redis answers again, the workers have
:data:`NO_WORKER_S` to be seen there before calls are refused for want of them.
"""

from __future__ import annotations

import json
import logging
import time
from typing import Any, Dict, List, Optional

from ...errors import NoWorkerError
from ...options.config import OPTIONS
from ...options.devices import shown_device
from .connection import broker_errors
from .wire import (
    GROUP,
    LIVE_WORKER_INFO_SCRIPT,
    LIVE_WORKERS_SCRIPT,
    PRESENCE_MS,
    Keys,
    LoadingWorker,
    loading_workers,
)

__all__ = ["Roster", "NO_WORKER_S", "LONGEST_RETRY_AFTER_S", "RECHECK_S"]

#: With ``require_workers``, calls are refused once no worker has been live for this long (seconds).
NO_WORKER_S = 2.5
#: The longest ``Retry-After`` given while the model loads (seconds).
LONGEST_RETRY_AFTER_S = 30.0
#: Before a call is refused for want of workers, Redis is asked again if it
#: was not within this many seconds: the roster is checked once a second,
#: and a worker that just loaded its model would see its first callers refused.
RECHECK_S = 0.05

logger = logging.getLogger("streamer_core.redis")


class Roster:
    """What one web process knows of the workers of ``keys``; ``check`` runs
    on its collector thread every second, the rest on any thread."""

    def __init__(self, keys: Keys, require_workers: bool, levels: int = 1) -> None:
        self._keys = keys
        self.require_workers = require_workers
        self._levels = levels
        #: The most priority levels a live worker reads, as last seen (``None``: not known).
        self.levels_read: Optional[int] = None
        self._told_levels: Optional[int] = None
        self._seen = float("-inf")  # monotonic time a live worker was last seen
        self._checked = False
        self._unreachable = False  # the last question to Redis went unanswered
        self._loading: List[LoadingWorker] = []
        self._loading_read = 0.0  # monotonic time _loading was read: it ages until the next check
        self._rechecked = float("-inf")  # monotonic time missing_now last asked Redis
        #: The batch size of each live worker, as last seen (:meth:`live_batch_sizes`).
        self.batch_sizes: List[int] = []
        self._infos: List[Optional[Dict[str, Any]]] = []  # the live workers' infos, as last read

    @property
    def watching(self) -> bool:
        """Whether the web process asks Redis about the workers every
        second: to refuse calls without them, or to learn which levels they read."""
        return self.require_workers or self._levels > 1

    def live(self, conn: Any) -> int:
        """How many workers serve this prefix now, by asking Redis."""
        live = int(conn.eval(LIVE_WORKERS_SCRIPT, 1, self._keys.workers, PRESENCE_MS))
        if live:
            self._seen = time.monotonic()
        return live

    def live_by_device(self, conn: Any) -> Dict[str, int]:
        """How many workers serve this prefix now, by device as each wrote
        it in its info (as its own metrics name it: ``default`` where none
        was given; ``unknown`` for a live worker whose info is missing or
        does not parse: anyone with access to Redis may write there), by
        asking Redis once; for ``streamer_workers_live_by_device``."""
        counts: Dict[str, int] = {}
        for info in self._live_infos(conn):
            device = _device_of(info)
            counts[device] = counts.get(device, 0) + 1
        return counts

    def wait_live(self, conn: Any, timeout: float) -> bool:
        """Wait until a worker serves this prefix; whether one did within
        ``timeout`` seconds (Redis not answering counts as none)."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                if self.live_batch_sizes(conn):
                    return True
            except broker_errors():
                pass
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.05)

    def live_batch_sizes(self, conn: Any) -> List[int]:
        """The batch size of each live worker, as its info says (the default
        batch size where it does not: a worker of an earlier release), kept
        as :attr:`batch_sizes`: a Redis web process lets in two batches'
        worth of a large call for each (``BatchFormer.gate_parked``)."""
        self._infos = self._live_infos(conn)
        self.batch_sizes = [_batch_size_of(info) for info in self._infos]
        return self.batch_sizes

    def _live_infos(self, conn: Any) -> List[Optional[Dict[str, Any]]]:
        """What each live worker wrote of itself, by asking Redis once: a
        dict, or ``None`` where it is missing or is not a JSON object
        (anyone with access to Redis may write there)."""
        infos = conn.eval(LIVE_WORKER_INFO_SCRIPT, 2, self._keys.workers, self._keys.worker_info, PRESENCE_MS)
        if infos:
            self._seen = time.monotonic()
        return [_parsed(raw) for raw in infos]

    def pending(self, conn: Any) -> int:
        """Requests of this prefix delivered to a worker and not yet
        acknowledged, by every web process, as Redis holds them (one XPENDING
        summary), for ``streamer_redis_pending``; 0 before any worker made
        the group. Raises what the connection raises."""
        import redis

        pending = 0
        for stream in self._keys.request_streams(self._levels):
            try:
                summary = conn.xpending(stream, GROUP)
            except redis.ResponseError as exc:
                if "NOGROUP" in str(exc):
                    continue
                raise
            pending += int(summary.get("pending") or 0)
        return pending

    def check(self, conn: Any) -> int:
        """Ask Redis which workers are live (their infos: the levels they
        read, their :attr:`batch_sizes`), and, while none is, which are
        loading their model; return how many are live. Raises what the
        client raises when Redis does not answer (see :meth:`unreachable`)."""
        try:
            live = len(self.live_batch_sizes(conn))
            loading = [] if live else loading_workers(conn, self._keys)
            if live and self._levels > 1:
                self._learn_levels(self._infos)
        except broker_errors():
            self.unreachable()
            raise
        if self._unreachable:
            # The time it could not be asked is no sign that no worker runs:
            # from now on they have NO_WORKER_S to be seen again.
            self._unreachable = False
            self._seen = max(self._seen, time.monotonic())
        self._loading, self._loading_read = loading, time.monotonic()
        self._checked = True
        return live

    def _learn_levels(self, infos: List[Optional[Dict[str, Any]]]) -> None:
        """The most levels a live worker reads, from their infos (read
        defensively: anyone with access to Redis may have written them); a
        worker that does not say reads one. Said once in the log while it
        is fewer than this process's."""
        found: Optional[int] = None
        for info in infos:
            if info is not None:
                levels = info.get("levels", 1)
                levels = levels if isinstance(levels, int) and not isinstance(levels, bool) and levels >= 1 else 1
                found = levels if found is None else max(found, levels)
        self.levels_read = found
        if found is not None and found < self._levels and self._told_levels != found:
            logger.warning(
                "the live workers of %s read %d priority level(s), and this web process sends %d: calls at "
                "priority %d and lower %s; start the workers with priority_levels=%d (--priority-levels %d)",
                self._keys.requests,
                found,
                self._levels,
                found + 1,
                "are refused" if self.require_workers else "wait for a worker that reads them",
                self._levels,
                self._levels,
            )
        self._told_levels = found

    def unread(self, level: int) -> Optional[NoWorkerError]:
        """With ``require_workers``: the error of a call at ``level`` (0 the
        highest) when no live worker reads that level's stream, as last
        seen; else ``None``."""
        read = self.levels_read
        if not self.require_workers or read is None or level < read:
            return None
        return NoWorkerError(
            f"no live worker reads priority {level + 1} of {self._keys.requests}: the workers read {read} level(s) "
            f"(started with priority_levels={read}, or of a version before priority levels); start them with "
            f"priority_levels={self._levels} (--priority-levels {self._levels}), then retry"
        )

    def unreachable(self) -> None:
        """Redis did not answer: nothing is known of the workers until it does."""
        self._unreachable = True

    def missing(self) -> bool:
        """With ``require_workers``: whether no worker has been live for
        :data:`NO_WORKER_S` seconds of the time Redis answered (or at all
        since this process started). Never while Redis does not answer."""
        if not (self.require_workers and self._checked) or self._unreachable:
            return False
        return time.monotonic() - self._seen > NO_WORKER_S

    def missing_now(self, conn: Any) -> bool:
        """:meth:`missing`, and if so, so says Redis asked now, unless it was
        within :data:`RECHECK_S` (or does not answer: the last word stands)."""
        if not self.missing():
            return False
        now = time.monotonic()
        if now - self._rechecked >= RECHECK_S:
            self._rechecked = now
            try:
                self.live(conn)  # a live worker seen moves the last sighting
            except broker_errors():
                pass
        return self.missing()

    def error(self) -> NoWorkerError:
        """What a call gets while no worker serves: the same whether it is new
        or was waiting already."""
        aged = time.monotonic() - self._loading_read  # the collector reads it about once a second
        return self.why_not(self._loading, f"(none has been alive for {NO_WORKER_S:g}s)", aged)

    def why_not_ready(self, conn: Any) -> Optional[str]:
        """Why no call can be served now (no live worker: loading, or not
        started), asked of Redis now; ``None`` when a worker is live."""
        if self.live(conn):
            return None
        return str(self.why_not(loading_workers(conn, self._keys), ""))

    def why_not(self, loading: List[LoadingWorker], since: str, aged_s: float = 0.0) -> NoWorkerError:
        """Why no worker serves: none started, or loading (for as long as
        the longest has, ``aged_s`` seconds after ``loading`` was read)."""
        key = self._keys.requests
        if not loading:
            return NoWorkerError(
                f"no worker serves {key}{' ' + since if since else ''}: start workers (streamer-worker, "
                "flask streamer run-workers or manage.py run_gpu_workers), then retry"
            )
        seconds = loading[0].seconds + aged_s
        error = NoWorkerError(
            f"the model of {key} is loading on {len(loading)} worker(s), for {seconds:.1f}s so far: retry in a moment"
        )
        error.retry_after_s = min(LONGEST_RETRY_AFTER_S, max(1.0, seconds))
        return error


def _parsed(raw: Any) -> Optional[Dict[str, Any]]:
    """A worker's info as the JSON object it wrote; ``None`` where there is
    none, or it is not JSON, or not an object."""
    try:
        info = json.loads(raw) if raw is not None else None
    except ValueError:
        return None
    return info if isinstance(info, dict) else None


def _device_of(info: Optional[Dict[str, Any]]) -> str:
    """A live worker's device from the info it wrote: ``CUDA_VISIBLE_DEVICES``
    as it serves, or ``null`` (``default``); ``unknown`` where the info is
    missing or is not what a worker writes."""
    device = info.get("device", False) if info is not None else False
    if device is None or isinstance(device, str):
        return shown_device(device)
    return "unknown"


def _batch_size_of(info: Optional[Dict[str, Any]]) -> int:
    """A live worker's batch size from the info it wrote; the default where
    the info has none, or one that is not a whole number of at least 1."""
    size = info.get("batch_size") if info is not None else None
    return size if type(size) is int and size >= 1 else int(OPTIONS["batch_size"].default)
