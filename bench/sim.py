"""A simulated accelerator for the benchmarks.

A batch of ``n`` inputs costs ``fixed_ms + per_item_ms * n`` milliseconds
slept in libc (``nanosleep`` through ctypes), taken while holding a
per-process lock (``DEVICE_LOCK``): calls queue for the "device" the way
kernels queue on a GPU, and the sleep blocks its OS thread with the GIL
released, the way a native model call does, so the cost model is the same
for a thread and for a process backend. Under gevent's ``monkey.patch_all()``
``time.sleep`` and ``threading.Lock`` would yield to the hub instead, which
flatters any library whose model runs in a greenlet: so neither is used, the
lock being the original one even when it is made after patching. The output of each input is the
input itself, which lets a client check that it got its own answer back.

Two entry points:

* :func:`make_predict` returns a plain ``predict(batch) -> list`` function for
  the thread backends (a ``functools.partial`` of a module-level function, so
  it also pickles for the process backends);
* :class:`SimModel` (streamer_core) and :class:`LegacySimModel`
  (service_streamer 0.1.2) are ``ManagedModel`` subclasses built inside each
  worker process with ``model_init_kwargs={"fixed_ms": ..., "per_item_ms": ...}``.
  Each library checks ``issubclass(model, its own ManagedModel)``, hence one
  tiny subclass per library sharing :class:`SimLogic`.

When the environment variable ``BENCH_SIM_BATCH_LOG`` names a directory, each
process appends one line ``<time.monotonic()> <batch size>`` per batch to
``<dir>/<pid>.log``; the benchmark reads these to report batch sizes, also for
batches run in worker processes. A model that has loaded (``init_model``
returned) also leaves an empty ``<dir>/<pid>.ready`` there, so a benchmark
can count the workers that are up.

:class:`RedisLegacySimModel` is for service_streamer's
``run_redis_workers_forever``, which calls ``init_model()`` without the
``model_init_kwargs`` it was given: its costs default to the environment
variables ``BENCH_SIM_FIXED_MS`` and ``BENCH_SIM_PER_ITEM_MS`` (set by the
benchmark for the worker processes, which inherit them), else 10 and 0.2.
"""

from __future__ import annotations

import ctypes
import functools
import os
import sys
import threading
import time
from typing import Any, Callable, List, Optional, Sequence, TextIO

import streamer_core

__all__ = [
    "DEVICE_LOCK",
    "block",
    "simulate_batch",
    "make_predict",
    "SimLogic",
    "SimModel",
    "LegacySimModel",
    "RedisLegacySimModel",
    "BATCH_LOG_ENV",
    "FIXED_MS_ENV",
    "PER_ITEM_MS_ENV",
]


def _os_lock() -> Any:
    """A lock of the OS, even after gevent patched ``threading``: one that
    blocks its thread, as a device does, rather than yielding to the hub."""
    monkey = sys.modules.get("gevent.monkey")
    if monkey is not None and monkey.is_module_patched("threading"):
        return monkey.get_original("_thread", "allocate_lock")()
    import _thread

    return _thread.allocate_lock()


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


_libc = ctypes.CDLL(None, use_errno=True)  # ctypes releases the GIL for the call


def block(seconds: float) -> None:
    """Block this OS thread for ``seconds``, the GIL released, never
    yielding to gevent (a device call, as the model's would be)."""
    whole = int(seconds)
    _libc.nanosleep(ctypes.byref(_Timespec(whole, int((seconds - whole) * 1e9))), None)


#: One simulated device per process: every batch in this process holds it.
DEVICE_LOCK = _os_lock()

#: Directory where each process logs its batch sizes (unset: no logging).
BATCH_LOG_ENV = "BENCH_SIM_BATCH_LOG"
#: The costs RedisLegacySimModel uses when init_model gets no arguments.
FIXED_MS_ENV = "BENCH_SIM_FIXED_MS"
PER_ITEM_MS_ENV = "BENCH_SIM_PER_ITEM_MS"

_log_lock = threading.Lock()
_log_file: Optional[TextIO] = None


def _log_batch(size: int, finished_at: float) -> None:
    """Append one batch to this process's batch log, if logging is on."""
    global _log_file
    directory = os.environ.get(BATCH_LOG_ENV)
    if not directory:
        return
    with _log_lock:
        if _log_file is None:
            _log_file = open(os.path.join(directory, f"{os.getpid()}.log"), "a", buffering=1)
        _log_file.write(f"{finished_at:.6f} {size}\n")


def _mark_ready() -> None:
    """Leave ``<pid>.ready`` in the batch-log directory, if logging is on."""
    directory = os.environ.get(BATCH_LOG_ENV)
    if directory:
        open(os.path.join(directory, f"{os.getpid()}.ready"), "w").close()


#: How many scores the simulated image classifier returns per image.
CLASSES = 1000


def simulate_batch(batch: Sequence[Any], fixed_ms: float, per_item_ms: float) -> List[Any]:
    """Run ``batch`` on the simulated device: wait for the device, hold it for
    ``fixed_ms + per_item_ms * len(batch)`` ms, return one output per input:
    the input itself, or for an image (an array of 3 or more dimensions) the
    first ``CLASSES`` of its values, as an image classifier returns scores."""
    cost_s = (fixed_ms + per_item_ms * len(batch)) / 1000.0
    with DEVICE_LOCK:
        block(cost_s)
        finished_at = time.monotonic()
    _log_batch(len(batch), finished_at)
    return [x.reshape(-1)[:CLASSES].copy() if getattr(x, "ndim", 0) >= 3 else x for x in batch]


def make_predict(fixed_ms: float, per_item_ms: float) -> Callable[[List[Any]], List[Any]]:
    """A ``predict(batch) -> list`` function with this cost; picklable."""
    return functools.partial(simulate_batch, fixed_ms=fixed_ms, per_item_ms=per_item_ms)


class SimLogic:
    """The model logic shared by both libraries' ``ManagedModel`` subclasses."""

    fixed_ms: float = 0.0
    per_item_ms: float = 0.0

    def init_model(self, fixed_ms: float, per_item_ms: float) -> None:  # type: ignore[override]
        """Called once inside the worker: store the cost of a batch."""
        self.fixed_ms = float(fixed_ms)
        self.per_item_ms = float(per_item_ms)
        _mark_ready()

    def predict(self, batch: List[Any]) -> List[Any]:
        return simulate_batch(batch, self.fixed_ms, self.per_item_ms)


class SimModel(SimLogic, streamer_core.ManagedModel):
    """The simulated model for streamer_core's ``Streamer``."""


try:  # service_streamer is optional: only the side-by-side comparison needs it
    import service_streamer as _service_streamer
except ImportError:  # pragma: no cover - depends on the installed extras
    LegacySimModel: Optional[type] = None
    RedisLegacySimModel: Optional[type] = None
else:

    class LegacySimModel(SimLogic, _service_streamer.ManagedModel):  # type: ignore[no-redef]
        """The simulated model for service_streamer 0.1.2's ``Streamer``."""

    class RedisLegacySimModel(LegacySimModel):  # type: ignore[no-redef, valid-type, misc]
        """For service_streamer 0.1.2's ``run_redis_workers_forever``, which
        drops ``model_init_kwargs``: without arguments, the costs come from
        ``BENCH_SIM_FIXED_MS`` / ``BENCH_SIM_PER_ITEM_MS``, else 10 / 0.2 ms."""

        def init_model(self, fixed_ms: Optional[float] = None, per_item_ms: Optional[float] = None) -> None:
            if fixed_ms is None:
                fixed_ms = float(os.environ.get(FIXED_MS_ENV, "10"))
            if per_item_ms is None:
                per_item_ms = float(os.environ.get(PER_ITEM_MS_ENV, "0.2"))
            super().init_model(fixed_ms, per_item_ms)
