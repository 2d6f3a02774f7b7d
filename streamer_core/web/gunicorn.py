"""gunicorn's server hooks for web processes that serve batched models: the
deployment policy of the examples, in one place, for any project's
``gunicorn.conf.py``. Each framework layer adds the hook that loads its
models (``post_worker_init``), so one line takes them all::

    from flask_streamer.gunicorn import child_exit, on_exit, on_starting, post_worker_init, pre_fork  # noqa: F401
    from django_streamer.gunicorn import child_exit, on_exit, on_starting, post_worker_init, pre_fork  # noqa: F401

What they do:

- ``on_starting``: with more than one worker, turn on prometheus_client's
  multiprocess mode in a fresh temporary directory (``on_exit`` removes
  it), so that ``/metrics`` adds up every worker's numbers, not the one
  process's that happens to answer the scrape;
- ``pre_fork``: each web process gets a core index of its own, the one of
  the process it replaces when it restarts;
- ``post_worker_init`` (the layer's): load the models in this process
  before it takes a request, then :func:`settle`: pin the process to its
  core where that takes nothing from a model computing on this CPU
  (:mod:`streamer_core.web.affinity`; ``PIN_WORKERS`` 1 always, 0 never),
  keep what loading made out of the garbage collector's sight, read
  request headers without the email package (:func:`read_headers_quickly`),
  send a response in one system call (:func:`write_in_one_send`), skip
  the access log's per-request work where nothing logs it
  (:func:`skip_unlogged_access`), and quit once when told to
  (:func:`quit_once`);
- ``child_exit``: under prometheus_client's multiprocess mode, a dead
  process's gauges go with it.

gunicorn itself is imported only where a hook is handed its objects.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import sys
import tempfile
from typing import Any, Dict, Iterable, Optional

from .. import shortcuts
from .affinity import free_core_index, model_computes_here, pin_to_core, pin_wanted
from .headers import quick_header_reading, quick_request_reading
from .settling import GC_THRESHOLD, freeze_after_loading
from .writing import one_send_writing

__all__ = [
    "on_starting",
    "on_exit",
    "pre_fork",
    "settle",
    "skip_unlogged_access",
    "write_in_one_send",
    "quit_once",
    "child_exit",
    "GC_THRESHOLD",
]

logger = logging.getLogger("streamer_core")

#: The multiprocess directory :func:`on_starting` made (``None``: it made
#: none), and the pid of the master that made it: only that process removes it.
_own_dir: Optional[str] = None
_own_pid = 0


def on_starting(server: Any) -> None:
    """Before the first worker forks: with more than one worker and no
    ``PROMETHEUS_MULTIPROC_DIR`` set, make a fresh temporary directory and
    set it, so that every worker writes its metrics there and a scrape of
    ``/metrics`` on any of them adds up all of them
    (:func:`streamer_core.telemetry.metrics.exposition`). Here, not in the config
    file's body, because only the hook sees the worker count the command
    line gave (``-w 4`` overrides the file's ``workers``).

    One worker keeps the one-process registry (cheaper to record into, and
    it carries ``prometheus_client``'s process metrics). A directory set
    already is the user's: used as it is, never removed. prometheus_client
    reads the variable when it is first imported, so it must not be
    imported in the master yet (``--preload`` of an app that imports it):
    then nothing is set, and a warning says why. Once the directory is
    set, its multiprocess module is imported here, for :func:`child_exit`."""
    global _own_dir, _own_pid
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        _import_multiprocess()
        return
    if server.cfg.workers <= 1:
        return
    if "prometheus_client" in sys.modules:
        logger.warning(
            "prometheus_client was imported before gunicorn forked its workers: each worker's /metrics "
            "shows its own numbers only; set PROMETHEUS_MULTIPROC_DIR to an empty directory before "
            "starting gunicorn to add them up"
        )
        return
    _own_dir = tempfile.mkdtemp(prefix="streamer-prometheus-")
    _own_pid = os.getpid()
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = _own_dir  # the workers inherit it
    _import_multiprocess()


def _import_multiprocess() -> None:
    """Import prometheus_client's multiprocess module in the master now,
    with ``PROMETHEUS_MULTIPROC_DIR`` set, for :func:`child_exit`: gunicorn
    before 26 calls that hook from its SIGCHLD handler, and an import begun
    there is re-entered when the next worker's exit interrupts it (a
    partly imported ``prometheus_client``: the master dies with an
    ``ImportError`` as it stops)."""
    try:
        import prometheus_client.multiprocess  # noqa: F401
    except ImportError:
        pass  # not installed: no metrics, nothing to mark dead


def on_exit(server: Any) -> None:
    """As gunicorn's master exits: remove the directory :func:`on_starting`
    made, unless a re-executed master (``USR2``) still runs on it."""
    global _own_dir
    reexec_pid: int = getattr(server, "reexec_pid", 0)
    if _own_dir is None or _own_pid != os.getpid() or reexec_pid:
        return
    shutil.rmtree(_own_dir, ignore_errors=True)
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR") == _own_dir:
        del os.environ["PROMETHEUS_MULTIPROC_DIR"]
    _own_dir = None


def pre_fork(server: Any, worker: Any) -> None:
    """Give the process about to start a core index: the smallest no live
    process holds (a replacement takes the dead one's)."""
    worker.core_index = free_core_index(getattr(other, "core_index", None) for other in server.WORKERS.values())


def settle(worker: Any, backends: Iterable[str], shortcuts_setting: bool = True) -> None:
    """After the process has loaded its models, served by ``backends``: pin
    it to its core where that takes nothing from a model computing here
    (the process backend's workers, spawned already, keep every core; a
    quarter less CPU per request than a process the scheduler moves about),
    and freeze what loading made (:func:`~streamer_core.web.settling.freeze_after_loading`).
    Each saves CPU on every request (the docs' Performance page).
    The handler's shortcuts through gevent's and gunicorn's workings are
    taken where :mod:`streamer_core.shortcuts` allows them
    (``shortcuts_setting``: the app's own switch)."""
    computes_here = any(model_computes_here(backend) for backend in backends)
    if pin_wanted(worker.cfg.workers, computes_here):
        pin_to_core(getattr(worker, "core_index", 0))
    freeze_after_loading()
    if shortcuts.allowed("gevent-reading", shortcuts_setting):
        read_headers_quickly(worker)
    if shortcuts.allowed("gevent-writing", shortcuts_setting):
        write_in_one_send(worker)
    if shortcuts.allowed("gunicorn-access-log", shortcuts_setting):
        skip_unlogged_access(worker)
    quit_once(worker)


def skip_unlogged_access(worker: Any) -> None:
    """Under gevent's own HTTP server (``-k gevent_pywsgi``), where no
    access log is written: give the process a request handler whose
    ``log_request`` does nothing. gunicorn's handler builds two datetimes
    and a response object for every request before its logger finds that
    access logging is off: a share of each request's CPU worth saving (the
    docs' Performance page). Left as it is where an
    access log is written (``--access-logfile``, a logging config), where
    the logger is another class (``--statsd-host``'s counts requests in
    ``access``), and where the logger does not say whether it logs access
    (older gunicorn releases).
    Runs before the worker starts its server, which takes the handler then."""
    handler = getattr(worker, "wsgi_handler", None)
    log = getattr(worker, "log", None)
    if handler is None or getattr(log, "access_log_enabled", True):
        return
    from gunicorn.glogging import Logger

    if getattr(type(log), "access", None) is not Logger.access:
        return
    _handle_with(worker, {"log_request": _log_nothing})


def read_headers_quickly(worker: Any) -> None:
    """Under gevent's own HTTP server (``-k gevent_pywsgi``): give the
    process a request handler that reads each request's headers without
    the email package's parser, into the same object
    (:mod:`streamer_core.web.headers`), more requests a second for less CPU
    each (the docs' Performance page); and
    that then looks each header up once to read the request and make its
    environ (fewer instructions a request). Left as it is where the
    handler reads headers or requests its own way.
    Runs before the worker starts its server, which takes the handler then."""
    handler: Any = getattr(worker, "wsgi_handler", None)
    reading = quick_header_reading(handler)
    if reading is not None:
        _handle_with(worker, {"MessageClass": reading})
    request = quick_request_reading(getattr(worker, "wsgi_handler", None))
    if request is not None:
        _handle_with(worker, request)


def write_in_one_send(worker: Any) -> None:
    """Under gevent's own HTTP server (``-k gevent_pywsgi``): give the
    process a request handler that sends a response's headers and a body
    of up to 64 KiB in one ``send`` where gevent makes four system calls,
    and dates responses from a ``Date`` made once a second
    (:mod:`streamer_core.web.writing`). Left as it is where the handler
    writes responses its own way.
    Runs before the worker starts its server, which takes the handler then."""
    handler: Any = getattr(worker, "wsgi_handler", None)
    writing = one_send_writing(handler)
    if writing is not None:
        _handle_with(worker, writing)


def _handle_with(worker: Any, attributes: Dict[str, Any]) -> None:
    """Give the worker a request handler: a subclass of its own with ``attributes``."""
    handler = worker.wsgi_handler
    worker.wsgi_handler = type(handler.__name__, (handler,), {**attributes, "__module__": __name__})


def _log_nothing(handler: Any) -> None:
    """A handler's ``log_request`` where no access log is written."""


def quit_once(worker: Any) -> None:
    """Make the process act on the first SIGINT or SIGQUIT only. A Ctrl-C
    signals every process of the terminal: the worker gets SIGINT, then
    its master's SIGQUIT; gevent's worker spawns a quit (``sys.exit(0)``)
    for each, and the second lands in Python's shutdown, where gevent
    prints it as a ``SystemExit: 0`` traceback. The flag is set in the
    signal handler itself, before any quit has run."""
    handle_quit = worker.handle_quit
    quitting = False

    def once(signum: int, frame: Any) -> None:
        nonlocal quitting
        if not quitting:
            quitting = True
            handle_quit(signum, frame)

    signal.signal(signal.SIGINT, once)
    signal.signal(signal.SIGQUIT, once)


def child_exit(server: Any, worker: Any) -> None:
    """Under prometheus_client's multiprocess mode (``PROMETHEUS_MULTIPROC_DIR``
    set, several processes): drop a dead process's gauges."""
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        multiprocess: Any = sys.modules.get("prometheus_client.multiprocess")
        if multiprocess is None:  # the directory was set after on_starting ran
            import prometheus_client.multiprocess as multiprocess

        multiprocess.mark_process_dead(worker.pid)
