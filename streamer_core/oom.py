"""Out-of-memory errors: telling them apart, and learning a batch cap from them.

A GPU that runs out of memory on a long batch would run each half of it.
The batch runner (:mod:`streamer_core.runner`) splits such a batch and
retries the halves, whatever ``isolate_errors`` says, so no caller sees the
error unless one input alone is too big. :class:`CostCap` then keeps later
batches from failing the same way first: it caps batches at the cost of the
largest part that ran, and lets the cap creep back up after a run of good
batches, since memory is shared and what did not fit once may fit later.

``oom_errors`` is the tuple of exception types taken for out of memory. By
default (``None``) it is ``torch.cuda.OutOfMemoryError`` when torch is
already imported where the model runs, and nothing otherwise: this module
never imports torch.
"""

from __future__ import annotations

import logging
import math
import sys
from typing import Any, Optional, Sequence, Tuple, Type

__all__ = ["CostCap", "check_oom_errors", "is_out_of_memory", "free_cached_memory"]

logger = logging.getLogger("streamer_core")

#: Good batches in a row, each costing at least half the cap, before the cap is raised.
GOOD_RUN = 20
#: How much the cap grows after a good run.
GROWTH = 1.25

OomErrors = Optional[Tuple[Type[BaseException], ...]]


def check_oom_errors(value: Any) -> OomErrors:
    """``None`` (torch's error, when torch is loaded), or a tuple of exception types."""
    if value is None:
        return None
    if isinstance(value, type) and issubclass(value, BaseException):
        return (value,)
    if not isinstance(value, (tuple, list)) or not all(
        isinstance(kind, type) and issubclass(kind, BaseException) for kind in value
    ):
        raise TypeError(
            "oom_errors must be a tuple of exception types (e.g. (torch.cuda.OutOfMemoryError,)), "
            f"() for none, or None for torch's when torch is loaded; got {value!r}"
        )
    return tuple(value)


def _torch_oom() -> Tuple[Type[BaseException], ...]:
    torch = sys.modules.get("torch")
    kind = getattr(getattr(torch, "cuda", None), "OutOfMemoryError", None)
    return (kind,) if isinstance(kind, type) else ()


def is_out_of_memory(exc: BaseException, oom_errors: OomErrors) -> bool:
    """Whether ``exc`` is one of ``oom_errors`` (``None``: torch's, if loaded)."""
    kinds = _torch_oom() if oom_errors is None else oom_errors
    return bool(kinds) and isinstance(exc, kinds)


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


class CostCap:
    """The most a batch may cost, learned from running out of memory.

    ``limit`` is ``inf`` until a batch runs out of memory; then it is the
    cost of the largest part of that batch that ran. After :data:`GOOD_RUN`
    batches in a row that ran and cost at least half the cap, it grows by
    :data:`GROWTH`, and it is lifted once it passes ``ceiling`` (the
    configured ``max_batch_cost`` or batch size, where one is set). Each
    change is logged once at WARNING. Not thread-safe: the scheduler holds
    its lock.
    """

    __slots__ = ("ceiling", "limit", "_good", "name")

    def __init__(self, ceiling: float, name: str = "") -> None:
        self.ceiling = ceiling
        self.limit = math.inf
        self._good = 0
        self.name = name

    @property
    def active(self) -> bool:
        """Whether a cap holds (batches are then shaped by cost)."""
        return not math.isinf(self.limit)

    def budget(self, configured: Optional[float]) -> float:
        """The most the next batch may cost: the configured
        ``max_batch_cost`` or this cap, whichever is lower (``inf``: neither)."""
        return min(math.inf if configured is None else configured, self.limit)

    def learn(self, costs: Sequence[float], rule: str, out_of_memory: bool, ran: Sequence[Tuple[int, int]]) -> None:
        """Learn from a batch of inputs of these ``costs`` that ran: if it
        ran out of memory (``ran``: the spans ``[start, end)`` of it whose
        model calls returned), cap at the costliest span that ran; if not,
        count it towards lifting the cap. ``rule`` is ``batch_cost``."""
        if not out_of_memory and not self.active:
            return  # the common case: nothing to learn
        from .batching import batch_cost

        if out_of_memory:
            fitted = max((batch_cost(rule, costs[start:end]) for start, end in ran if end > start), default=0.0)
            self.ran_out(batch_cost(rule, costs), fitted)
        elif costs:
            self.ran(batch_cost(rule, costs))

    def ran_out(self, cost: float, fitted: float) -> None:
        """A batch costing ``cost`` ran out of memory; the costliest part of
        it that ran costs ``fitted`` (0 when no part ran)."""
        self._good = 0
        if fitted <= 0 or fitted >= self.limit:
            return  # one input alone is too big (it fails, alone), or the cap is lower already
        before = self.limit
        self.limit = fitted
        logger.warning(
            "%sout of memory on a batch costing %.6g: batches are capped at a cost of %.6g now (was %s)",
            self._where(),
            cost,
            fitted,
            "no cap" if math.isinf(before) else f"{before:.6g}",
        )

    def ran(self, cost: float) -> None:
        """A batch costing ``cost`` ran without running out of memory."""
        limit = self.limit
        if math.isinf(limit) or cost < limit / 2:
            return
        self._good += 1
        if self._good < GOOD_RUN:
            return
        self._good = 0
        raised = limit * GROWTH
        self.limit = math.inf if raised >= self.ceiling else raised
        logger.warning(
            "%s%d batches ran near the cap: batches are capped at %s now (was %.6g)",
            self._where(),
            GOOD_RUN,
            "no cap but the configured ones" if math.isinf(self.limit) else f"a cost of {self.limit:.6g}",
            limit,
        )

    def _where(self) -> str:
        return f"{self.name}: " if self.name else ""
