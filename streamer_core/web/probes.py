"""Liveness and readiness, whatever the web framework.

The Flask extension and the Django app answer their ``/healthz`` and
``/readyz`` routes from here, so both say the same thing:

* liveness: 200 while the process serves requests at all;
* readiness: 200 only when every model can serve a call now (its model
  loaded, for the thread and process backends; Redis reachable and at least
  one live worker, for the Redis backend), else 503 naming each model that
  cannot and why. A model not started in this process yet is started on a
  thread of its own (loading it can take a while); the probe answers 503
  "starting" meanwhile, within :data:`PROBE_BUDGET_S` whatever happens.
"""

from __future__ import annotations

import time
from typing import Any, Dict, Mapping, Optional, Tuple

from ..threads import background
from .http import RETRY_AFTER_DOWN
from .spec import LazyStreamer

__all__ = ["PROBE_BUDGET_S", "liveness", "readiness", "unready", "ProbeAnswer"]

#: Seconds a readiness probe may take in all; a model whose check has not
#: answered by then (a broker that hangs) is reported not ready.
PROBE_BUDGET_S = 0.8

#: ``(status, JSON body, headers)``.
ProbeAnswer = Tuple[int, Dict[str, Any], Dict[str, str]]


def liveness() -> ProbeAnswer:
    """The process serves: always 200."""
    return 200, {"status": "alive"}, {}


def readiness(handles: Mapping[str, LazyStreamer], draining: bool = False) -> ProbeAnswer:
    """200 when every model of ``handles`` (by name) can serve now, else 503
    with ``Retry-After``; the body says, per model, ``ready`` and, when not,
    ``reason``."""
    deadline = time.monotonic() + PROBE_BUDGET_S
    results: Dict[str, Optional[str]] = {}
    checks = []
    for name, handle in handles.items():
        if draining:
            results[name] = "this process is shutting down"
            continue
        result: Dict[str, Optional[str]] = {}
        thread = background(_check_into, f"streamer-ready-{name}", (handle, deadline, result))
        thread.start()
        checks.append((name, thread, result))
    for name, thread, result in checks:
        thread.join(max(0.0, deadline - time.monotonic()))
        if thread.is_alive() or "reason" not in result:
            results[name] = f"its check did not answer within {PROBE_BUDGET_S:g}s"
        else:
            results[name] = result["reason"]
    models = {}
    for name, handle in handles.items():
        reason = results[name]
        entry: Dict[str, Any] = {"backend": handle.spec.backend, "ready": reason is None}
        if reason is not None:
            entry["reason"] = reason
        models[name] = entry
    ready = all(entry["ready"] for entry in models.values())
    if ready:
        return 200, {"status": "ready", "models": models}, {}
    return 503, {"status": "unavailable", "models": models}, {"Retry-After": str(RETRY_AFTER_DOWN)}


def unready(error: BaseException) -> ProbeAnswer:
    """503: the settings themselves are wrong, so no model can serve."""
    return 503, {"status": "unavailable", "error": str(error)}, {"Retry-After": str(RETRY_AFTER_DOWN)}


def _check_into(handle: LazyStreamer, deadline: float, result: Dict[str, Optional[str]]) -> None:
    result["reason"] = why_not_ready(handle, deadline)


def why_not_ready(handle: LazyStreamer, deadline: float) -> Optional[str]:
    """Why the model of ``handle`` cannot serve a call now, or ``None``."""
    if not handle.started:
        starting = handle.start_in_background()
        starting.join(max(0.0, deadline - time.monotonic() - 0.05))
        if not handle.started:
            error = handle.start_error
            if error is not None and not starting.is_alive():
                return f"the model could not start: {error}"
            return "starting: the model is loading in this process"
    try:
        return handle.get().why_not_ready()
    except Exception as exc:  # a streamer that cannot be reached is not ready, whatever the reason
        return f"{type(exc).__name__}: {exc}"
