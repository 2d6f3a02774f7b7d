"""gunicorn's server hooks for web processes that serve batched models: the
deployment policy of the examples, in one place, for any project's
``gunicorn.conf.py``. Each framework layer adds the hook that loads its
models (``post_worker_init``), so one line takes them all::

    from flask_streamer.gunicorn import child_exit, post_worker_init, pre_fork  # noqa: F401
    from django_streamer.gunicorn import child_exit, post_worker_init, pre_fork  # noqa: F401

What they do:

- ``pre_fork``: each web process gets a core index of its own, the one of
  the process it replaces when it restarts;
- ``post_worker_init`` (the layer's): load the models in this process
  before it takes a request, then :func:`settle`: pin the process to its
  core where that takes nothing from a model computing on this CPU
  (:mod:`streamer_core.web.affinity`; ``PIN_WORKERS`` 1 always, 0 never),
  keep what loading made out of the garbage collector's sight, and quit
  once when told to (:func:`quit_once`);
- ``child_exit``: under prometheus_client's multiprocess mode, a dead
  process's gauges go with it.

gunicorn itself is not imported here: the hooks get its objects.
"""

from __future__ import annotations

import gc
import os
import signal
from typing import Any, Iterable

from .affinity import free_core_index, model_computes_here, pin_to_core, pin_wanted

__all__ = ["pre_fork", "settle", "quit_once", "child_exit", "GC_THRESHOLD"]

#: The collector's thresholds in a settled web process: its first
#: generation collected once per thousand requests or so, not every 70.
GC_THRESHOLD = (10_000, 10, 10)


def pre_fork(server: Any, worker: Any) -> None:
    """Give the process about to start a core index: the smallest no live
    process holds (a replacement takes the dead one's)."""
    worker.core_index = free_core_index(getattr(other, "core_index", None) for other in server.WORKERS.values())


def settle(worker: Any, backends: Iterable[str]) -> None:
    """After the process has loaded its models, served by ``backends``: pin
    it to its core where that takes nothing from a model computing here
    (the process backend's workers, spawned already, keep every core; a
    quarter less CPU per request than a process the scheduler moves about),
    and freeze what loading made (the model, torch's and the framework's
    modules: some 450,000 objects, never garbage), so that a full
    collection takes milliseconds, not 350 ms that stall every request.
    Together about 50 microseconds of CPU a request (bench/README.md)."""
    computes_here = any(model_computes_here(backend) for backend in backends)
    if pin_wanted(worker.cfg.workers, computes_here):
        pin_to_core(getattr(worker, "core_index", 0))
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLD)
    quit_once(worker)


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
        from prometheus_client import multiprocess

        multiprocess.mark_process_dead(worker.pid)  # type: ignore[no-untyped-call]
