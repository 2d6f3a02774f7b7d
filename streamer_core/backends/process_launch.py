"""How the process backend starts one worker process: the model's spec,
pickled once for every start, the pipe between parent and worker, and the
arguments :func:`.process_worker.worker_main` is given.

Kept apart from :mod:`.process_backend`, which decides when a slot gets a
process (at start, after a death, after a backoff) and holds its lock while
it changes a slot: here a process is only made and started.
"""

from __future__ import annotations

import os
import pickle
import threading
from typing import Any, Dict, Optional, Sequence, Tuple

from ..options.config import BatchingConfig
from ..streamer import callable_name
from .process_slots import Slot
from .process_worker import worker_main
from .spawning import spawn_context

__all__ = ["Launcher", "pickled_spec"]

_ctx = spawn_context()


def pickled_spec(target: Any, init_args: Sequence[Any], init_kwargs: Dict[str, Any]) -> bytes:
    """The model and its init arguments as each spawned worker receives them;
    ``TypeError`` saying why when they do not pickle."""
    try:
        return pickle.dumps((target, tuple(init_args), dict(init_kwargs)), pickle.HIGHEST_PROTOCOL)
    except Exception as exc:
        raise TypeError(
            f"{callable_name(target)} and its model_init_args/model_init_kwargs must be picklable: "
            "spawned workers import the model by name, so define it at module level "
            f"(not a lambda or a nested function) and pass plain init arguments ({exc})"
        ) from exc


class Launcher:
    """Starts worker processes for the slots of one backend.

    ``name`` is the model's (a traced batch's span names it);
    ``shared_memory_min_bytes`` the least bytes a result's buffer needs to
    come back through shared memory, under names that start with
    ``prefix`` (``None``: results come through the pipe)."""

    def __init__(
        self,
        spec: bytes,
        config: BatchingConfig,
        name: str,
        prefix: str,
        shared_memory_min_bytes: Optional[int],
    ) -> None:
        self._spec = spec
        self._config = config
        self._name = name
        self._prefix = prefix
        self._min_bytes = shared_memory_min_bytes
        # The cores workers run on, as now: a web process pinned later
        # (streamer_core.web.affinity) does not hand its one core down.
        self._cpus = frozenset(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None

    def launch(self, slot: Slot, lock: threading.Lock) -> Tuple[Any, Any]:
        """Start a new process for ``slot``, its next generation (counted
        under ``lock``, the backend's); return it and the parent's end of its
        pipe. On failure both ends of the pipe are closed and the error raised."""
        parent_conn, child_conn = _ctx.Pipe()
        # Under gevent's monkey-patching the pipe is a socketpair made
        # non-blocking for the hub, and the flag travels with the descriptor:
        # the worker's reads failed with EAGAIN (it took that for its parent
        # gone and exited) and a send to a full pipe was dropped. Both ends
        # block, as they do unpatched; the collector reads only once wait()
        # has said a message is there.
        for conn in (parent_conn, child_conn):
            os.set_blocking(conn.fileno(), True)
        with lock:
            slot.generation += 1
            slot.free, slot.gone = [], []
            min_bytes = self._min_bytes
            shared = (slot.block_prefix(self._prefix), min_bytes) if min_bytes is not None else None
        config = self._config
        trace_as = (self._name, f"worker {slot.index}") if config.tracing else None
        args = (
            child_conn, self._spec, slot.device, os.getpid(), config.isolate_errors, config.oom_errors, shared,
            self._cpus, trace_as,
        )  # fmt: skip
        process = _ctx.Process(
            target=worker_main,
            args=args,
            name=f"streamer-worker-{slot.index}",
            daemon=True,
        )
        try:
            process.start()
        except BaseException:
            child_conn.close()
            parent_conn.close()
            raise
        child_conn.close()
        return process, parent_conn
