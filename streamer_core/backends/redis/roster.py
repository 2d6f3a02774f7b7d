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

Only the time Redis could be asked counts: while it cannot be reached (a
restart, a failover) nothing is known of the workers, who lose it too, and
calls fail with :class:`~streamer_core.BrokerUnavailableError` instead (the
sends say so). Once Redis answers again, the workers have
:data:`NO_WORKER_S` to be seen there before calls are refused for want of them.
"""

from __future__ import annotations

import json
import time
from typing import Any, Dict, List, Optional

from ...devices import shown_device
from ...errors import NoWorkerError
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

__all__ = ["Roster", "NO_WORKER_S", "LONGEST_RETRY_AFTER_S"]

#: With ``require_workers``, calls are refused once no worker has been live for this long (seconds).
NO_WORKER_S = 2.5
#: The longest ``Retry-After`` given while the model loads (seconds).
LONGEST_RETRY_AFTER_S = 30.0


class Roster:
    """What one web process knows of the workers of ``keys``; ``check`` runs
    on its collector thread every second, the rest on any thread."""

    def __init__(self, keys: Keys, require_workers: bool) -> None:
        self._keys = keys
        self.require_workers = require_workers
        self._seen = float("-inf")  # monotonic time a live worker was last seen
        self._checked = False
        self._unreachable = False  # the last question to Redis went unanswered
        self._loading: List[LoadingWorker] = []

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
        infos = conn.eval(LIVE_WORKER_INFO_SCRIPT, 2, self._keys.workers, self._keys.worker_info, PRESENCE_MS)
        if infos:
            self._seen = time.monotonic()
        counts: Dict[str, int] = {}
        for raw in infos:
            device = _device_of(raw)
            counts[device] = counts.get(device, 0) + 1
        return counts

    def pending(self, conn: Any) -> int:
        """Requests of this prefix delivered to a worker and not yet
        acknowledged, by every web process, as Redis holds them (one XPENDING
        summary), for ``streamer_redis_pending``; 0 before any worker made
        the group. Raises what the connection raises."""
        import redis

        try:
            summary = conn.xpending(self._keys.requests, GROUP)
        except redis.ResponseError as exc:
            if "NOGROUP" in str(exc):
                return 0
            raise
        return int(summary.get("pending") or 0)

    def check(self, conn: Any) -> int:
        """Ask Redis which workers are live, and, while none is, which are
        loading their model; return how many are live. Raises what the
        client raises when Redis does not answer (see :meth:`unreachable`)."""
        try:
            live = self.live(conn)
            loading = [] if live else loading_workers(conn, self._keys)
        except broker_errors():
            self.unreachable()
            raise
        if self._unreachable:
            # The time it could not be asked is no sign that no worker runs:
            # from now on they have NO_WORKER_S to be seen again.
            self._unreachable = False
            self._seen = max(self._seen, time.monotonic())
        self._loading = loading
        self._checked = True
        return live

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

    def error(self) -> NoWorkerError:
        """What a call gets while no worker serves: the same whether it is new
        or was waiting already."""
        return self.why_not(self._loading, f"(none has been alive for {NO_WORKER_S:g}s)")

    def why_not_ready(self, conn: Any) -> Optional[str]:
        """Why no call can be served now (no live worker: loading, or not
        started), asked of Redis now; ``None`` when a worker is live."""
        if self.live(conn):
            return None
        return str(self.why_not(loading_workers(conn, self._keys), ""))

    def why_not(self, loading: List[LoadingWorker], since: str) -> NoWorkerError:
        key = self._keys.requests
        if not loading:
            return NoWorkerError(
                f"no worker serves {key}{' ' + since if since else ''}: start workers (streamer-worker, "
                "flask streamer run-workers or manage.py run_gpu_workers), then retry"
            )
        seconds = loading[0].seconds
        error = NoWorkerError(
            f"the model of {key} is loading on {len(loading)} worker(s), for {seconds:.1f}s so far: retry in a moment"
        )
        error.retry_after_s = min(LONGEST_RETRY_AFTER_S, max(1.0, seconds))
        return error


def _device_of(raw: Any) -> str:
    """A live worker's device from the info it wrote: ``CUDA_VISIBLE_DEVICES``
    as it serves, or ``null`` (``default``); ``unknown`` where the info is
    missing or is not what a worker writes."""
    try:
        info = json.loads(raw) if raw is not None else None
    except ValueError:
        info = None
    device = info.get("device", False) if isinstance(info, dict) else False
    if device is None or isinstance(device, str):
        return shown_device(device)
    return "unknown"
