"""The streamers of this web process, one per model of ``STREAMER["MODELS"]``.

Each is started on its first use (:func:`get_streamer`), never at import or
in ``AppConfig.ready()``, and again in a forked child (gunicorn forks its
workers after importing the project with ``--preload``). Every streamer this
process started is closed at exit: queued calls finish, worker processes of
the process backend stop. When a test changes ``settings.STREAMER``
(``override_settings``), the streamers are closed and the next use reads the
new settings.
"""

from __future__ import annotations

import atexit
import threading
from typing import Any, Dict, List, Optional

from asgiref.sync import sync_to_async
from django.core.exceptions import ImproperlyConfigured
from django.core.signals import setting_changed

from streamer_core.streamer import BaseStreamer
from streamer_core.web.spec import LazyStreamer, ModelSpec, start_all

from .conf import model_specs

__all__ = [
    "get_streamer",
    "aget_streamer",
    "get_spec",
    "model_names",
    "start_streamers",
    "started_models",
    "close_streamers",
    "drain",
    "draining",
    "all_handles",
]

#: Seconds :func:`close_streamers` gives queued calls at exit.
CLOSE_TIMEOUT_SECONDS = 10.0

_lock = threading.Lock()
_handles: Optional[Dict[str, LazyStreamer]] = None
_atexit_registered = False
_draining = False


def _all_handles() -> Dict[str, LazyStreamer]:
    global _handles, _atexit_registered
    handles = _handles
    if handles is not None:
        return handles
    with _lock:
        if _handles is None:
            _handles = {name: LazyStreamer(spec) for name, spec in model_specs().items()}
            if not _atexit_registered:
                atexit.register(close_streamers)
                _atexit_registered = True
        return _handles


def _handle(name: str) -> LazyStreamer:
    handles = _all_handles()
    try:
        return handles[name]
    except KeyError:
        known = ", ".join(map(repr, handles)) or "none"
        raise ImproperlyConfigured(
            f"no model named {name!r} in settings.STREAMER['MODELS'] (it has {known}): add it there or correct the name"
        ) from None


def get_spec(name: str) -> ModelSpec:
    """The settings of the model ``name``, checked. Raises
    :class:`ImproperlyConfigured` for an unknown name or bad settings."""
    return _handle(name).spec


def model_names() -> List[str]:
    """The models of ``STREAMER["MODELS"]``, in settings order."""
    return list(_all_handles())


def get_streamer(name: str) -> BaseStreamer:
    """The streamer of the model ``name``, started in this process if it is
    not yet (for the thread backend with a ManagedModel, that loads the
    model, here and now). Call ``predict([x])`` or ``submit([x])`` on it.
    Raises :class:`ImproperlyConfigured` for an unknown name or bad settings,
    :class:`WorkerStartError` (a 503) when the model cannot be built."""
    return _start(_handle(name))


def _start(handle: LazyStreamer) -> BaseStreamer:
    # A model that cannot be built raises WorkerStartError (a 503) from get().
    return handle.get()


async def aget_streamer(name: str) -> BaseStreamer:
    """:func:`get_streamer` for ``async`` code: the first use, which reads
    the settings, imports the model and may load it, runs on a worker thread
    so the event loop keeps serving."""
    handles = _handles
    handle = handles.get(name) if handles is not None else None
    if handle is not None and handle.started:
        return handle.get()
    return await sync_to_async(get_streamer, thread_sensitive=False)(name)


def start_streamers(wait: bool = True, timeout: float = 120.0) -> None:
    """Start every model's streamer in this process now, not on its first
    request; with ``wait``, until the models this process runs are loaded
    (for up to ``timeout`` seconds; Redis workers run elsewhere, and are not
    waited for). A server's worker calls it as it boots, after forking: in
    gunicorn's ``post_worker_init`` hook, or under an ASGI server at the end
    of ``asgi.py``."""
    start_all(_all_handles().values(), wait, timeout)


def started_models() -> List[str]:
    """The models whose streamer this process has started (and not closed)."""
    handles = _handles
    return [name for name, handle in (handles or {}).items() if handle.started]


def close_streamers(timeout: float = CLOSE_TIMEOUT_SECONDS) -> None:
    """Close every streamer this process started, letting queued calls
    finish for up to ``timeout`` seconds each; the next use reads the
    settings again and starts anew. Runs at exit."""
    global _handles
    with _lock:
        handles, _handles = _handles, None
    for handle in (handles or {}).values():
        handle.close(timeout)


def all_handles() -> Dict[str, LazyStreamer]:
    """Every model's streamer handle, by name (none started by this)."""
    return dict(_all_handles())


def drain(timeout: float = CLOSE_TIMEOUT_SECONDS) -> None:
    """Shut this process's side down gracefully: from now on new calls to a
    batched view get 503 with ``Retry-After`` (and readiness answers 503),
    while calls in hand finish for up to ``timeout`` seconds; then every
    streamer stops. For a server's shutdown hook, e.g. gunicorn's
    ``worker_exit``."""
    global _draining
    _draining = True
    close_streamers(timeout)


def draining() -> bool:
    """Whether :func:`drain` was called in this process."""
    return _draining


def _on_setting_changed(setting: str, **_kwargs: Any) -> None:
    if setting == "STREAMER":
        close_streamers(timeout=5.0)


setting_changed.connect(_on_setting_changed, dispatch_uid="django_streamer.registry")
