"""Call deadlines, soonest first: :class:`Deadlines`, kept by the
:class:`~streamer_core.batching.scheduler.Scheduler` so that every call ends by its
timeout wherever its inputs are."""

from __future__ import annotations

import heapq
import itertools
from collections import deque
from typing import Any, Deque, Generic, List, Optional, Protocol, Tuple, TypeVar

__all__ = ["Deadlines"]


class Call(Protocol):
    """What the deadlines need of a call: its timeout, and its future while it runs."""

    timeout: float
    future: Optional[Any]


C = TypeVar("C", bound=Call)


class Deadlines(Generic[C]):
    """Call deadlines, soonest first. Calls on the streamer's own timeout
    arrive in deadline order, so they take a FIFO (O(1) a call); only calls
    with a timeout of their own go through a heap. Finished calls stay until
    their deadline and are swept out when the records grow, so memory
    follows the calls still running."""

    def __init__(self, standard_timeout: float) -> None:
        self.standard = standard_timeout
        self._fifo: Deque[Tuple[float, C]] = deque()
        self._heap: List[Tuple[float, int, C]] = []
        self._seq = itertools.count()
        self._sweep_at = 4096

    def add(self, deadline: float, task: C) -> bool:
        """Record ``task``; return whether its deadline is now the soonest."""
        if len(self._fifo) + len(self._heap) >= self._sweep_at:
            self._sweep()
        if task.timeout == self.standard:
            self._fifo.append((deadline, task))
            return len(self._fifo) == 1 and (not self._heap or deadline < self._heap[0][0])
        heapq.heappush(self._heap, (deadline, next(self._seq), task))
        return self._heap[0][2] is task and (not self._fifo or deadline < self._fifo[0][0])

    def pop_expired(self, now: float) -> List[C]:
        expired = []
        fifo, heap = self._fifo, self._heap
        while fifo and fifo[0][0] <= now:
            expired.append(fifo.popleft()[1])
        while heap and heap[0][0] <= now:
            expired.append(heapq.heappop(heap)[2])
        return expired

    def soonest(self) -> float:
        first = self._fifo[0][0] if self._fifo else float("inf")
        return min(first, self._heap[0][0]) if self._heap else first

    def tasks(self) -> List[C]:
        return [task for _, task in self._fifo] + [entry[2] for entry in self._heap]

    def clear(self) -> None:
        self._fifo.clear()
        self._heap.clear()

    def _sweep(self) -> None:
        self._fifo = deque(entry for entry in self._fifo if entry[1].future is not None)
        self._heap = [entry for entry in self._heap if entry[2].future is not None]
        heapq.heapify(self._heap)
        self._sweep_at = max(4096, 2 * (len(self._fifo) + len(self._heap)))
