"""One CPU core per web process, for a server's hooks (the examples'
``gunicorn.conf.py`` use them).

A web process's Python work is bound by its GIL to about one core at a
time, but the scheduler moves it, and the threads beside its event loop
(the thread backend's model thread, the tokenizer inside it), from core to
core; each move, and each hand-over of the GIL between threads on two
cores, costs caches that were warm. Pinned to one core each, the examples'
web processes spent less CPU per request and served more requests a second
(the docs' Performance page, and the docs' Deploy section). Where the process's own model computes on the
CPU with cores to spare, pinning would take them from it: :func:`pin_wanted`
tells the two apart.

The process backend's workers are spawned with the CPU affinity their web
process had when its streamer was made, not the one pinned later: see
``backends/process_backend.py``. Where the platform cannot pin (no
``os.sched_setaffinity``, as on macOS), nothing is done.
"""

from __future__ import annotations

import os
import sys
from typing import Iterable, Optional

__all__ = ["free_core_index", "model_computes_here", "pin_to_core", "pin_wanted"]


def free_core_index(taken: Iterable[Optional[int]]) -> int:
    """The smallest core index not in ``taken`` (the indexes of the web
    processes alive; ``None`` for one that has none): a new process takes
    the core of the one it replaces."""
    used = {index for index in taken if index is not None}
    index = 0
    while index in used:
        index += 1
    return index


def model_computes_here(backend: str) -> bool:
    """Whether a web process whose streamers run on ``backend`` computes
    their model on its own CPU: the thread backend, without a GPU that
    torch (imported by then, if the model uses it) can see."""
    torch = sys.modules.get("torch")
    on_gpu = torch is not None and bool(torch.cuda.is_available())
    return backend == "thread" and not on_gpu


def pin_wanted(web_processes: int, model_computes_here: bool) -> bool:
    """Whether to pin a web process to one core. ``PIN_WORKERS`` decides
    when set (``1``: always, ``0``: never); by default (``auto``) when it
    takes nothing from a model: the process's models compute elsewhere
    (spawned workers, Redis workers, a GPU), or there are at least as many
    web processes (``web_processes``) as cores, so that each has one
    anyway. A model computing on this process's CPU with cores to spare
    keeps them: pinned, torch's threads would share one core (the Flask
    example, one process on 2 cores: 164 requests/s pinned against 255)."""
    setting = os.environ.get("PIN_WORKERS", "auto").strip().lower()
    if setting not in ("0", "1", "auto"):
        raise ValueError(f"PIN_WORKERS must be 1 (pin), 0 (do not) or auto (the default), got {setting!r}")
    if setting != "auto":
        return setting == "1"
    if not hasattr(os, "sched_getaffinity"):
        return False
    return not model_computes_here or web_processes >= len(os.sched_getaffinity(0))


def pin_to_core(index: int) -> Optional[int]:
    """Pin this process, every thread it has (Linux sets a thread's affinity,
    not a process's) and so every thread they start, to the ``index``-th of
    the cores it may run on (modulo their number); return that core, or
    ``None`` where it cannot be pinned or has one core only."""
    if not hasattr(os, "sched_setaffinity"):
        return None
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < 2:
        return None
    core = cores[index % len(cores)]
    try:
        threads = [int(tid) for tid in os.listdir("/proc/self/task")]
    except OSError:
        threads = [0]  # no /proc: this thread, and those it starts
    for tid in threads:
        try:
            os.sched_setaffinity(tid, {core})
        except ProcessLookupError:
            pass  # a thread that ended meanwhile
    return core
