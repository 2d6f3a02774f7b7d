"""Out-of-memory errors: telling them apart, and making room after one.

A GPU that runs out of memory on a long batch would run each half of it.
The batch runner (:mod:`streamer_core.batching.runner`) splits such a batch and
retries the halves, whatever ``isolate_errors`` says, so no caller sees the
error unless one input alone is too big; :class:`~streamer_core.batching.shaping.CostCap`
then keeps later batches from failing the same way first.

``oom_errors`` is the tuple of exception types taken for out of memory. By
default (``None``) it is ``torch.cuda.OutOfMemoryError`` when torch is
already imported where the model runs, and nothing otherwise: this module
never imports torch.
"""

from __future__ import annotations

import logging
import sys
from typing import Any, Tuple, Type

from ..errors import WorkerStartError
from ..options.checks import OomErrors

__all__ = ["is_out_of_memory", "free_cached_memory", "load_failure"]

logger = logging.getLogger("streamer_core")


def _torch_oom() -> Tuple[Type[BaseException], ...]:
    torch = sys.modules.get("torch")
    kind = getattr(getattr(torch, "cuda", None), "OutOfMemoryError", None)
    return (kind,) if isinstance(kind, type) else ()


def is_out_of_memory(exc: BaseException, oom_errors: OomErrors) -> bool:
    """Whether ``exc`` is one of ``oom_errors`` (``None``: torch's, if loaded)."""
    kinds = _torch_oom() if oom_errors is None else oom_errors
    return bool(kinds) and isinstance(exc, kinds)


def load_failure(exc: BaseException, oom_errors: OomErrors, device: Any) -> BaseException:
    """What a worker reports when its model could not load: ``exc`` itself,
    or, where it ran out of memory, a :class:`WorkerStartError` that says
    what to look at. A GPU that another process holds fails a model's load
    this way, and torch's message names the bytes, not the cause."""
    if not is_out_of_memory(exc, oom_errors):
        return exc
    where = "its device" if device is None else f"device {device}"
    error = WorkerStartError(
        f"the model ran out of memory on {where} while it loaded: another process may hold that "
        "memory (nvidia-smi lists the processes on each GPU), or the model does not fit there; "
        f"{type(exc).__name__}: {exc}"
    )
    error.__cause__ = exc
    return error


def free_cached_memory() -> None:
    """Give the memory torch's allocator keeps cached back to the GPU, so
    the halves of a batch that ran out have room; nothing without torch."""
    torch = sys.modules.get("torch")
    cuda = getattr(torch, "cuda", None)
    try:
        if cuda is not None and cuda.is_available():
            cuda.empty_cache()
    except Exception:  # a broken CUDA context: the retry will say so itself
        logger.debug("torch.cuda.empty_cache() failed", exc_info=True)
