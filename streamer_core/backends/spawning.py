"""Spawned worker processes, from any host program.

multiprocessing's spawn start method runs ``sys.executable`` for each
child. Under an embedding server that is not Python: uWSGI sets it to its
own binary, whose options parser then refuses multiprocessing's arguments,
and every worker dies before it loads its model. :func:`spawn_context` gives
the spawn context, set to run this interpreter's ``python`` (that of the
virtualenv, when there is one) wherever ``sys.executable`` is not Python.
:func:`thread_locks_for_progress_bars` is what a spawned worker does before
its model loads.
"""

from __future__ import annotations

import importlib.util
import multiprocessing
import multiprocessing.context
import os
import sys
import threading
from typing import Optional

__all__ = ["spawn_context", "python_executable", "thread_locks_for_progress_bars"]


def thread_locks_for_progress_bars() -> None:
    """Give tqdm a thread lock before a worker's model loads. tqdm (the
    progress bars of transformers, huggingface_hub and many a loader) makes
    a multiprocessing lock on first use: in a spawned process a named
    semaphore, which a worker killed by ``kill -9`` or the kernel's
    out-of-memory killer cannot remove, and the resource tracker warns of
    it as the server stops ("leaked semaphore objects"). A worker shares no
    progress bar with other processes; a thread lock is all it needs."""
    if importlib.util.find_spec("tqdm") is not None:  # not a dependency: the model's, where it has it
        importlib.import_module("tqdm").tqdm.set_lock(threading.RLock())


def python_executable() -> Optional[str]:
    """The Python interpreter to spawn workers with, when ``sys.executable``
    is something else (``None`` when it is Python, or none is found)."""
    current = os.path.basename(sys.executable or "")
    if current.startswith(("python", "pypy")):
        return None
    bin_dir = os.path.join(sys.prefix, "bin")
    major, minor = sys.version_info[:2]
    for name in (f"python{major}.{minor}", f"python{major}", "python"):
        candidate = os.path.join(bin_dir, name)
        if os.access(candidate, os.X_OK):
            return candidate
    base = getattr(sys, "_base_executable", None)
    return base if base and os.path.basename(base).startswith("python") else None


def spawn_context() -> multiprocessing.context.SpawnContext:
    """multiprocessing's spawn context, running a Python interpreter."""
    context = multiprocessing.get_context("spawn")
    executable = python_executable()
    if executable is not None:
        context.set_executable(executable)
    return context
