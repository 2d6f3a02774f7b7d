"""The inputs of large calls not yet in line: :class:`ParkedCalls`.

A call of more inputs than a batch holds
(:meth:`~streamer_core.batching.former.BatchFormer.add_call`) puts a
batch's worth in line and parks the rest here; after each batch taken, as
many parked inputs as it held join the back of the line, the parked calls
taking turns (whose turn it is, the former's queue says:
:meth:`~streamer_core.batching.queues.WaitingQueue.turn`). Where the owner
gates them (:meth:`~streamer_core.batching.former.BatchFormer.gate_parked`), a
call whose inputs out unanswered reach its limit keeps its turn and waits.
"""

from __future__ import annotations

from collections import deque
from typing import Any, Callable, Deque, Generic, Iterator, List, Optional, Sequence, TypeVar

from .queues import Waiting, kept

__all__ = ["ParkedCalls"]

T = TypeVar("T", bound=Waiting)


class ParkedCalls(Generic[T]):
    """Each parked call's inputs in its order, the calls in the order they
    take turns. ``live``/``drop``: as the former's (a call given up is
    dropped as it is met); ``turn(calls)``: which call joins the line next."""

    def __init__(
        self,
        live: Callable[[T], bool],
        drop: Callable[[T], None],
        turn: Callable[[Sequence[Sequence[T]]], int],
    ) -> None:
        self._calls: Deque[Deque[T]] = deque()
        self.count = 0  # inputs parked (given-up ones may still be counted)
        self._live, self._drop, self._turn = live, drop, turn
        #: Where gated: how many inputs of a call may be out (``None``: no gate).
        self.out_limit: Optional[Callable[[], int]] = None
        # Where gated: how many of a call's inputs are not answered yet (given its first).
        self._unanswered: Callable[[T], int] = _nothing_out

    def gate(self, out_limit: Callable[[], int], unanswered: Callable[[T], int]) -> None:
        """Let a call's inputs join the line only while fewer than
        ``out_limit()`` of them are out (see
        :meth:`~streamer_core.batching.former.BatchFormer.gate_parked`)."""
        self.out_limit = out_limit
        self._unanswered = unanswered

    def park(self, inputs: Sequence[T], turn: int) -> Sequence[T]:
        """Park one call's ``inputs`` but its first ``turn`` (where gated, no
        more than may be out), its turn after the calls parked before; return
        those first, to wait in line."""
        if self.out_limit is not None:
            turn = max(1, min(turn, self.out_limit()))
        if len(inputs) <= turn:
            return inputs
        self._calls.append(deque(inputs[turn:]))
        self.count += len(inputs) - turn
        return inputs[:turn]

    def __bool__(self) -> bool:
        return bool(self._calls)

    def __iter__(self) -> Iterator[T]:
        for call in self._calls:
            yield from call

    def in_level(self, level: int, level_of: Callable[[T], int]) -> int:
        """Inputs parked at ``level`` (a call's inputs are all of one level)."""
        return sum(len(call) for call in self._calls if level_of(call[0]) == level)

    def clear(self) -> None:
        self._calls.clear()
        self.count = 0

    def compact(self) -> None:
        """Drop every given-up input now."""
        calls = (deque(kept(call, self._live, self._drop)) for call in self._calls)
        self._calls = deque(call for call in calls if call)
        self.count = sum(map(len, self._calls))

    def unpark(self, count: int) -> List[T]:
        """Take up to ``count`` parked inputs to join the back of the line,
        in the order they join it: the next call's in turn, then the
        next; a call given up is dropped; a call at its gate keeps its turn."""
        calls, live = self._calls, self._live
        limit = None if self.out_limit is None else self.out_limit()
        held: List[Deque[T]] = []  # calls at their gate, in turn
        moving: List[T] = []
        while count > 0 and calls:
            index = self._turn(calls)
            call = calls[index]
            del calls[index]
            if not live(call[0]):  # its call ended (one future for all its inputs)
                self.count -= len(call)
                for each in call:
                    self._drop(each)
                continue
            room = len(call) if limit is None else limit - (self._unanswered(call[0]) - len(call))
            if room <= 0:
                held.append(call)
                continue
            moved = [call.popleft() for _ in range(min(count, room, len(call)))]
            self.count -= len(moved)
            count -= len(moved)
            moving.extend(moved)
            if call:
                calls.append(call)
        calls.extendleft(reversed(held))
        return moving


def _nothing_out(_: Any) -> int:
    return 0
