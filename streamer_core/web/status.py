"""What ``flask streamer status`` and ``manage.py streamer_status`` report.

For each model: its backend and batch settings and, for the Redis backend,
what Redis says now: the live workers (host, pid, device, last beat), the
requests waiting for a worker and those a worker holds (pending), and with
priority levels each level's, the age of the oldest waiting request, and on a Redis Cluster the node that
holds the model's keys. A model is well when, for Redis, the
broker answers and at least one worker is live (its settings were checked
when its spec was made); the commands exit non-zero otherwise, so they serve
as a container's health check. Thread and process backends run inside each
web process: a command run beside them can show their settings only.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import asdict, dataclass, field
from typing import Any, Dict, List, Optional, Sequence

from ..options.config import shown_device
from .spec import ModelSpec

__all__ = ["WorkerStatus", "ModelStatus", "model_status", "render_text", "render_json", "render_json_error"]


@dataclass(frozen=True)
class WorkerStatus:
    """One live Redis worker, as it announces itself."""

    name: str
    host: Optional[str]
    pid: Optional[int]
    device: Optional[str]
    #: Seconds since its last heartbeat, by the Redis server's clock.
    last_beat_s: float
    #: Seconds it has been loading its model (a worker not serving yet), else None.
    loading_s: Optional[float] = None


@dataclass
class ModelStatus:
    """One model's state; ``problems`` empty means well."""

    name: str
    backend: str
    settings: Dict[str, Any]
    problems: List[str] = field(default_factory=list)
    workers: List[WorkerStatus] = field(default_factory=list)
    #: Workers started and still loading their model (Redis backend).
    loading: List[WorkerStatus] = field(default_factory=list)
    #: Requests in Redis no worker has taken yet (Redis backend).
    waiting: Optional[int] = None
    #: Requests a worker has taken and not answered yet (Redis backend).
    pending: Optional[int] = None
    #: Seconds the oldest waiting request has waited (Redis backend; None: none waits).
    oldest_waiting_s: Optional[float] = None
    #: On a Redis Cluster, the node that holds this model's keys (host:port) and their slot.
    node: Optional[str] = None
    slot: Optional[int] = None
    #: Redis backend: the workers one ``run-workers`` command starts
    #: (``worker_num``), which says nothing of how many are live.
    configured_workers: Optional[int] = None
    #: Redis backend with priority levels: each level's waiting and pending requests, level 1 first.
    levels: Optional[List[Dict[str, int]]] = None

    @property
    def ok(self) -> bool:
        return not self.problems


def model_status(spec: ModelSpec, worker_command: str = "streamer-worker") -> ModelStatus:
    """The state of ``spec``'s model: its settings, and for Redis, asked now;
    ``worker_command``: how the user of the layer asking starts Redis workers,
    named where none serves (``streamer-worker`` too, which any can run).
    Raises :class:`~streamer_core.errors.ConfigurationError` when Redis
    refuses the URL's database number or credentials: nothing can be asked."""
    config = spec.config
    settings: Dict[str, Any] = {
        "batch_size": config.batch_size,
        "max_latency": config.max_latency,
        "timeout": config.timeout,
        "max_queue": config.max_queue,
    }
    if spec.backend == "process":
        settings["worker_num"] = spec.worker_num
    if spec.backend == "thread" and spec.model_threads > 1:
        settings["model_threads"] = spec.model_threads
    if config.shapes_by_cost:
        settings.update(max_batch_cost=config.max_batch_cost, batch_cost=config.batch_cost)
    if config.priority_levels > 1:
        settings.update(priority_levels=config.priority_levels, default_priority=config.default_priority)
    status = ModelStatus(spec.name, spec.backend, settings)
    if spec.backend == "redis":
        # worker_num is what one run-workers command starts, not how many
        # serve: those are counted live, and the two are shown apart.
        status.configured_workers = spec.worker_num
        settings.update(redis_url=spec.redis.redacted, prefix=spec.prefix)
        _redis_status(spec, status, worker_command)
    return status


def _redis_status(spec: ModelSpec, status: ModelStatus, worker_command: str) -> None:
    from ..backends.redis.connection import (
        broker_errors,
        broker_problem,
        connect,
        on_node_of,
        refuses_setup,
        server_time_ms,
        setup_refused,
    )
    from ..backends.redis.wire import PRESENCE_MS, Keys, loading_workers

    address = spec.redis
    keys = Keys(spec.prefix, address.is_cluster)
    conn = connect(address, asking=True)  # a health check: a frozen Redis said in a second
    try:
        node = on_node_of(conn, keys.requests).get("target_nodes")
        if node is not None:  # a Cluster: every key of the model is in one slot (Keys)
            status.node, status.slot = str(node.name), int(conn.keyslot(keys.requests))
        now_ms = server_time_ms(conn, keys.workers)
        beats = conn.zrangebyscore(keys.workers, now_ms - PRESENCE_MS, "+inf", withscores=True)
        info = conn.hgetall(keys.worker_info) if conn.type(keys.worker_info) == b"hash" else {}
        for member, beat_ms in beats:
            status.workers.append(_worker(member, info.get(member), max(0.0, (now_ms - beat_ms) / 1000)))
        for loading in loading_workers(conn, keys):
            worker = _worker(loading.name, json.dumps(loading.info), 0.0)
            status.loading.append(dataclasses.replace(worker, loading_s=round(loading.seconds, 1)))
        levels = [_stream_status(conn, stream, now_ms) for stream in keys.request_streams(spec.config.priority_levels)]
        status.waiting = sum(level["waiting"] for level in levels)
        status.pending = sum(level["pending"] for level in levels)
        ages = [level["oldest_ms"] for level in levels if level["oldest_ms"] >= 0]
        status.oldest_waiting_s = max(ages) / 1000 if ages else None
        if len(levels) > 1:
            status.levels = [{"waiting": level["waiting"], "pending": level["pending"]} for level in levels]
    except Exception as exc:
        if refuses_setup(exc):  # no answer to be had until the URL is fixed: the command cannot ask
            raise setup_refused(address, exc) from exc
        if not isinstance(exc, broker_errors()):
            raise
        status.problems.append(broker_problem(exc, address))
        return
    finally:
        conn.close()
    if not status.workers and status.loading:
        status.problems.append(
            f"no worker serves {keys.requests} yet: {len(status.loading)} loading the model, "
            f"the longest for {status.loading[0].loading_s}s"
        )
    elif not status.workers:
        also = "" if worker_command == "streamer-worker" else " or streamer-worker"
        status.problems.append(f"no live worker serves {keys.requests}: start them ({worker_command}{also})")


def _stream_status(conn: Any, stream: str, now_ms: float) -> Dict[str, int]:
    """One requests stream's ``waiting`` and ``pending`` requests, and the
    age of the oldest waiting one in ms (``oldest_ms``; -1: none waits)."""
    from ..backends.redis.wire import GROUP

    if conn.type(stream) != b"stream":
        return {"waiting": 0, "pending": 0, "oldest_ms": -1}
    length = int(conn.xlen(stream))
    groups = {_text(g.get("name")): g for g in conn.xinfo_groups(stream)}
    group = groups.get(GROUP)
    pending = int(group.get("pending") or 0) if group else 0
    last = _text(group.get("last-delivered-id")) if group else "0-0"
    oldest = conn.xrange(stream, f"({last}", "+", count=1)
    age = int(max(0.0, now_ms - int(_text(oldest[0][0]).partition("-")[0]))) if oldest else -1
    return {"waiting": max(0, length - pending), "pending": pending, "oldest_ms": age}


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def _worker(member: Any, raw: Any, last_beat_s: float) -> WorkerStatus:
    """A worker from its presence entry and its info, read defensively:
    anyone with access to Redis may have written anything there."""
    name = _text(member)
    host: Optional[str] = None
    pid: Optional[int] = None
    device: Optional[str] = None
    try:
        data = json.loads(raw) if raw is not None else {}
    except ValueError:
        data = {}
    if isinstance(data, dict):
        host = data["host"] if isinstance(data.get("host"), str) else None
        pid = data["pid"] if isinstance(data.get("pid"), int) else None
        device = str(data["device"]) if isinstance(data.get("device"), (str, int)) else None
    if host is None or pid is None:  # a worker of an older version: its name is host-pid-random
        parts = name.rsplit("-", 2)
        if len(parts) == 3 and parts[1].isdigit():
            host, pid = host or parts[0], pid or int(parts[1])
    return WorkerStatus(name, host, pid, device, round(last_beat_s, 3))


def render_text(statuses: Sequence[ModelStatus], worker_command: str) -> str:
    """The statuses as lines for a terminal; ``worker_command``: the web
    layer's command that starts Redis workers (``run-workers``,
    ``run_gpu_workers``), which ``worker_num`` counts per run of."""
    lines = []
    for status in statuses:
        mark = "ok" if status.ok else "PROBLEM"
        settings = ", ".join(f"{key}={value}" for key, value in status.settings.items())
        lines.append(f"{status.name} [{status.backend}] {mark}: {settings}")
        if status.backend == "redis" and status.waiting is not None:
            oldest = "" if status.oldest_waiting_s is None else f", oldest waiting {status.oldest_waiting_s:.3g}s"
            if status.node is not None:
                lines.append(f"  cluster node: {status.node} (slot {status.slot})")
            lines.append(f"  requests: {status.waiting} waiting, {status.pending} pending{oldest}")
            if status.levels is not None:
                each = "; ".join(
                    f"{n}: {level['waiting']} waiting, {level['pending']} pending"
                    for n, level in enumerate(status.levels, 1)
                )
                lines.append(f"  by priority: {each}")
            configured = (
                ""
                if status.configured_workers is None
                else (f" (configured: worker_num={status.configured_workers} per {worker_command} command)")
            )
            lines.append(f"  live workers: {len(status.workers)}{configured}")
            for worker in status.workers:
                lines.append(f"    {_about(worker)}, last beat {worker.last_beat_s:.3g}s ago")
            if status.loading:
                lines.append(f"  workers loading the model: {len(status.loading)}")
                lines.extend(f"    {_about(worker)}, loading for {worker.loading_s}s" for worker in status.loading)
        lines.extend(f"  problem: {problem}" for problem in status.problems)
    return "\n".join(lines)


def _about(worker: WorkerStatus) -> str:
    return f"{worker.name}: host {worker.host}, pid {worker.pid}, device {shown_device(worker.device)}"


def render_json(statuses: Sequence[ModelStatus]) -> str:
    """The statuses as one JSON object: ``{"ok": bool, "models": {name: ...}}``."""
    models = {status.name: dict(asdict(status), ok=status.ok) for status in statuses}
    return json.dumps({"ok": all(status.ok for status in statuses), "models": models}, indent=2)


def render_json_error(messages: Sequence[str]) -> str:
    """What the status commands print with ``--json`` when they cannot ask
    a model (wrong settings, a model name that is none): the same object,
    not ok, no models, and why (``"errors"``, a line each), so that a
    script reading the output reads JSON whatever happened."""
    return json.dumps({"ok": False, "models": {}, "errors": list(messages)}, indent=2)
