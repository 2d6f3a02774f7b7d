"""The line of inputs waiting in a :class:`~streamer_core.batching.former.BatchFormer`:
:class:`WaitingQueue`, what a former needs of it, and :class:`FifoQueue`,
the one line in arrival order of a model without priority levels.

The former decides *when* a batch goes and how many it holds; the queue
says *which* inputs come next and which one's wait counts: one line in
arrival order here, one line per priority level in
:class:`~streamer_core.batching.levels.LeveledQueue`. The former owns the
inputs before they join the line (those to run alone, the parked inputs
of large calls) and asks the queue only whose turn it is among parked
calls.

A queue meets given-up inputs as it serves: it drops them, each told to
its former (``drop``), which is what :meth:`WaitingQueue.attach` hands it
with the test of whether an input is still wanted (``live``).
"""

from __future__ import annotations

from collections import deque
from typing import Any, Callable, Deque, Iterator, List, Optional, Protocol, Sequence, TypeVar

__all__ = ["Waiting", "WaitingQueue", "FifoQueue"]


class Waiting(Protocol):
    """What the former needs of an input."""

    cost: float
    arrival: float


T = TypeVar("T", bound=Waiting)


class WaitingQueue(Protocol[T]):
    """The inputs in line, as a former serves them. None of its methods
    takes a lock: the former's owner holds its own."""

    #: How many priority levels it serves (1: one line).
    levels: int

    def attach(self, live: Callable[[T], bool], drop: Callable[[T], None]) -> None:
        """Told once, by the former it is given to: ``live(input)``,
        whether its caller still wants it; ``drop(input)``, where each
        given-up input the queue meets goes."""

    def __len__(self) -> int:
        """Inputs in line (given-up ones may still be counted)."""

    def __iter__(self) -> Iterator[T]:
        """Every input in line, given-up ones too."""

    def add(self, inputs: Sequence[T]) -> None:
        """Queue ``inputs`` at the back, in their order."""

    def put_back(self, inputs: Sequence[T]) -> None:
        """Queue ``inputs`` again at the head, in their order."""

    def oldest(self) -> Optional[T]:
        """The input whose wait says when a batch goes, given-up ones at
        the head dropped; ``None`` when nothing live waits."""

    def pop(self, count: int, newest: bool = False) -> List[T]:
        """Up to ``count`` live inputs, taken out in serving order
        (``newest``: the newest first); given-up ones met are dropped."""

    def give_back(self, inputs: Sequence[T], newest: bool) -> None:
        """Return what :meth:`pop` took and a batch did not hold, where it
        was in line, in its order (``newest``: popped newest first)."""

    def taken_before(self, arrival: float) -> List[T]:
        """Take out, in line's order, the inputs at the head that arrived
        before ``arrival`` (a standing queue's longest waiting)."""

    def compact(self) -> None:
        """Drop every given-up input now."""

    def clear(self) -> None:
        """Forget every input."""

    def level_next(self) -> int:
        """The level whose input a batch would take first (0 with one level)."""

    def level_of(self, each: T) -> int:
        """The level ``each`` waits at (0 with one level)."""

    def in_level(self, level: int) -> int:
        """Inputs in line at ``level`` (given-up ones may still be counted)."""

    def turn(self, calls: Sequence[Sequence[T]]) -> int:
        """Which of the parked ``calls`` (each's live inputs, in turn)
        joins the line next, by index."""


class FifoQueue(WaitingQueue[T]):
    """One line, in arrival order (but for inputs put back at its head)."""

    levels = 1

    def __init__(self) -> None:
        self._line: Deque[T] = deque()
        self._live: Callable[[T], bool] = _always
        self._drop: Callable[[T], None] = _ignore

    def attach(self, live: Callable[[T], bool], drop: Callable[[T], None]) -> None:
        self._live, self._drop = live, drop

    def __len__(self) -> int:
        return len(self._line)

    def __iter__(self) -> Iterator[T]:
        return iter(self._line)

    def add(self, inputs: Sequence[T]) -> None:
        self._line.extend(inputs)

    def put_back(self, inputs: Sequence[T]) -> None:
        self._line.extendleft(reversed(inputs))

    def oldest(self) -> Optional[T]:
        line, live = self._line, self._live
        while line and not live(line[0]):
            self._drop(line.popleft())
        return line[0] if line else None

    def pop(self, count: int, newest: bool = False) -> List[T]:
        line, live = self._line, self._live
        pop = line.pop if newest else line.popleft
        taken: List[T] = []
        while line and len(taken) < count:
            first = pop()
            if live(first):
                taken.append(first)
            else:
                self._drop(first)
        return taken

    def give_back(self, inputs: Sequence[T], newest: bool) -> None:
        if newest:
            self._line.extend(reversed(inputs))
        else:
            self._line.extendleft(reversed(inputs))

    def taken_before(self, arrival: float) -> List[T]:
        # Inputs wait in line in their order of arrival but for a large
        # call's, which join it later: those are met as their call's first
        # inputs are refused, their call then over.
        line = self._line
        taken: List[T] = []
        while line and line[0].arrival < arrival:
            taken.append(line.popleft())
        return taken

    def compact(self) -> None:
        self._line = deque(kept(self._line, self._live, self._drop))

    def clear(self) -> None:
        self._line.clear()

    def level_next(self) -> int:
        return 0

    def level_of(self, each: T) -> int:
        return 0

    def in_level(self, level: int) -> int:
        return len(self._line) if level == 0 else 0

    def turn(self, calls: Sequence[Sequence[T]]) -> int:
        return 0  # the calls take turns in the order they came


def kept(inputs: Deque[T], live: Callable[[T], bool], drop: Callable[[T], None]) -> Iterator[T]:
    """The live ones of ``inputs``; the others told to ``drop``."""
    for each in inputs:
        if live(each):
            yield each
        else:
            drop(each)


def _always(_: Any) -> bool:
    return True


def _ignore(_: Any) -> None:
    pass
