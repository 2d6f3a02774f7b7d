"""One CPU core per web process, for a server's hooks (the examples'
``gunicorn.conf.py`` use them).

A web process's Python work is bound by its GIL to about one core at a
time, but the scheduler moves it, and the threads beside its event loop
(the thread backend's model thread, the tokenizer inside it), from core to
core; each move, and each hand-over of the GIL between threads on two
cores, costs caches that were warm. Pinned to one core each, the examples'
web processes spent 0.62 ms of CPU per request instead of 0.89 on the
thread backend, and 0.59 instead of 0.77 on the Redis backend, serving 30%
more requests per second (2-core machine, ``bench/scale_bench.py``; the
README's Deploy section).

The process backend's workers are spawned with the CPU affinity their web
process had when its streamer was made, not the one pinned later: see
``backends/process.py``. Where the platform cannot pin (no
``os.sched_setaffinity``, as on macOS), nothing is done.
"""

from __future__ import annotations

import os
from typing import Iterable, Optional

__all__ = ["free_core_index", "pin_to_core"]


def free_core_index(taken: Iterable[Optional[int]]) -> int:
    """The smallest core index not in ``taken`` (the indexes of the web
    processes alive; ``None`` for one that has none): a new process takes
    the core of the one it replaces."""
    used = {index for index in taken if index is not None}
    index = 0
    while index in used:
        index += 1
    return index


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
