"""Batches shaped by what their inputs cost, and the cap learned from running out of memory.

One shaper, :class:`CostShaper`, serves wherever a batch forms: the
in-process scheduler (:mod:`streamer_core.batching.scheduler`) and the Redis worker.
It holds the rule (``batch_cost``: a padding model pays its batch's length
times its costliest input, another the sum), the budget (``max_batch_cost``)
and the :class:`CostCap` learned from out-of-memory errors, and picks a
batch out of the inputs waiting (:func:`shape_batch`): the oldest first,
then those closest to it in cost, within ``batch_size`` and the budget.

A GPU that ran out of memory on a batch runs its halves (see
:mod:`streamer_core.batching.runner`); the cap then keeps later batches below the
cost of the largest part that ran, and creeps back up after a run of good
batches, since memory is shared and what did not fit once may fit later.
"""

from __future__ import annotations

import logging
import math
from typing import TYPE_CHECKING, Callable, List, Optional, Sequence, Tuple, TypeVar

if TYPE_CHECKING:
    from ..options.config import BatchingConfig
    from .queues import Waiting, WaitingQueue

__all__ = ["CostShaper", "CostCap", "CostBound", "batch_cost", "shape_batch", "take_shaped", "GOOD_RUN", "GROWTH"]

logger = logging.getLogger("streamer_core")

#: Good batches in a row, each costing at least half the cap, before the cap is raised.
GOOD_RUN = 20
#: How much the cap grows after a good run.
GROWTH = 1.25


def batch_cost(rule: str, costs: Sequence[float]) -> float:
    """What a batch of inputs of these ``costs`` costs: its length times the
    costliest (``"max"``: the model pads to the longest) or their sum."""
    return len(costs) * max(costs) if rule == "max" else float(sum(costs))


def shape_batch(costs: Sequence[float], size: int, budget: float, rule: str, grouped: bool) -> List[int]:
    """Which of the waiting inputs (their ``costs``, oldest first) make the
    next batch, by index: the oldest, then, when ``grouped``, those closest
    to it in cost (else the next in line), each taken if the batch stays
    within ``size`` inputs and costs at most ``budget`` by ``rule`` (see
    :func:`batch_cost`). The oldest always goes, alone if it is over the
    budget by itself, so no input waits behind a stream of others. Shared
    by the in-process scheduler and the Redis worker."""
    if not costs:
        return []
    lead = costs[0]
    if lead > budget:
        return [0]  # over the budget by itself: it runs alone
    order: Sequence[int] = range(1, len(costs))
    if grouped:
        order = sorted(order, key=lambda i: abs(costs[i] - lead))  # stable: ties by arrival
    taken = [0]
    padded = rule == "max"
    top = total = lead
    for i in order:
        if len(taken) >= size:
            break
        cost = costs[i]
        after = (len(taken) + 1) * max(top, cost) if padded else total + cost
        if after > budget:
            continue  # a cheaper one further on may still fit
        taken.append(i)
        top, total = max(top, cost), total + cost
    return taken


T = TypeVar("T", bound="Waiting")


def take_shaped(queue: WaitingQueue[T], shaper: CostShaper, size: int, window: int, newest: bool = False) -> List[T]:
    """A batch of at most ``size`` taken out of ``queue``, led by the input
    it serves first (``newest``: the newest), shaped by :func:`shape_batch`
    among the next ``window`` inputs in serving order; the rest wait on
    where they were, in their order."""
    candidates = queue.pop(window, newest)
    taken = shaper.shape([each.cost for each in candidates])[:size]
    chosen = set(taken)
    queue.give_back([each for i, each in enumerate(candidates) if i not in chosen], newest)
    return [candidates[i] for i in taken]


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


class CostBound:
    """At most what the inputs in line cost, given-up ones too: kept as
    inputs arrive and made tight again per batch, it tells most arrivals at
    once that the line is not over a batch's budget, without looking at
    each input (:meth:`CostShaper.line_over_budget`)."""

    __slots__ = ("top", "total")

    def __init__(self) -> None:
        self.top = 0.0  # the costliest input's cost
        self.total = 0.0  # the sum of their costs

    def add_one(self, cost: float) -> None:
        self.top = max(self.top, cost)
        self.total += cost

    def add(self, costs: Sequence[float]) -> None:
        if costs:
            self.top = max(self.top, max(costs))
            self.total += sum(costs)

    def tighten(self, costs: Sequence[float]) -> None:
        """The inputs in line cost ``costs`` now."""
        self.top, self.total = max(costs, default=0.0), float(sum(costs))


class CostShaper:
    """How one model's batches are shaped by cost: the configured budget
    and rule, and the cap learned from running out of memory. Not
    thread-safe: its owner (the scheduler, the Redis worker) holds a lock.

    ``costed``: whether inputs carry costs of their own (an ``item_cost``
    here, or costs sent by a web process); else each input costs 1, and a
    learned cap is lifted once it grows past ``batch_size``."""

    __slots__ = ("size", "rule", "configured", "grouped", "wanted", "cap")

    def __init__(self, config: BatchingConfig, *, costed: bool) -> None:
        self.size = config.batch_size
        self.rule = config.batch_cost
        self.configured = config.max_batch_cost
        self.grouped = costed
        self.wanted = config.item_cost is not None or config.max_batch_cost is not None
        if config.max_batch_cost is not None:
            ceiling = config.max_batch_cost
        else:
            ceiling = math.inf if costed else float(config.batch_size)
        self.cap = CostCap(ceiling)

    @property
    def active(self) -> bool:
        """Whether batches are shaped by cost now: the configuration asks
        for it, or a cap learned from running out of memory holds."""
        return self.wanted or self.cap.active

    def budget(self) -> float:
        """The most the next batch may cost (``inf``: no limit)."""
        return self.cap.budget(self.configured)

    def over_budget(self, costs: Sequence[float]) -> bool:
        """Whether inputs of these ``costs`` together are more than one
        batch's budget: a batch of them is as full as it can be."""
        budget = self.budget()
        return bool(costs) and not math.isinf(budget) and batch_cost(self.rule, costs) > budget

    def line_over_budget(self, count: int, bound: CostBound, costs: Callable[[], Sequence[float]]) -> bool:
        """Whether ``count`` inputs in line, costing at most ``bound``, are
        more than one batch's budget; ``costs()``: what the live ones cost,
        asked only where the bound cannot tell."""
        budget = self.budget()
        if math.isinf(budget):
            return False
        most = count * bound.top if self.rule == "max" else bound.total
        return most > budget and self.over_budget(costs())  # else even counting each at its most, not over

    def shape(self, costs: Sequence[float]) -> List[int]:
        """Which of the waiting inputs (their ``costs``, oldest first) make
        the next batch, by index: see :func:`shape_batch`."""
        return shape_batch(costs, self.size, self.budget(), self.rule, self.grouped)

    def learn(self, costs: Sequence[float], out_of_memory: bool, ran: Sequence[Tuple[int, int]]) -> None:
        """Learn from a batch of inputs of these ``costs`` that ran (see :meth:`CostCap.learn`)."""
        self.cap.learn(costs, self.rule, out_of_memory, ran)
