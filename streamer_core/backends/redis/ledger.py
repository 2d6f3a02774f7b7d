"""What a Redis web process has sent and waits for: :class:`Ledger`.

Every input a web process hands to Redis gets a random request id; the
ledger keeps, by that id, the input waiting for its answer, the stream
entry it was added as (to delete it when its call ends unanswered), and,
with priority levels, how many wait at each level (each level's bound,
``priority_max_queue``, counts them). The dispatcher adds, the collector
takes answers out, a caller that gives up takes its inputs out (their
entries then go to the deleter), all under one lock.
"""

from __future__ import annotations

import threading
from typing import Dict, List, Optional, Sequence, Tuple

from ...batching.calls import Item
from ...errors import QueueFullError
from .wire import new_request_id

__all__ = ["Ledger"]


class Ledger:
    """The inputs sent (or being sent) to Redis and not answered yet, by
    request id, for a model of ``levels`` priority levels."""

    def __init__(self, levels: int = 1) -> None:
        self.lock = threading.Lock()
        self._pending: Dict[bytes, Item] = {}  # sent, not answered yet; by request id
        self._entries: Dict[bytes, bytes] = {}  # their stream entry ids
        self._abandoned: List[Tuple[int, bytes]] = []  # (level, entry) of calls that ended unanswered: to delete
        self._by_level = [0] * levels  # pending inputs at each level
        #: Set when there are entries to delete (see :meth:`take_abandoned`).
        self.abandon = threading.Event()

    def add(self, items: Sequence[Item]) -> List[Tuple[bytes, Item]]:
        """Give each of ``items`` a new request id and wait for its answer."""
        sent = []
        with self.lock:
            for item in items:
                request_id = new_request_id()
                self._pending[request_id] = item
                self._by_level[item.level] += 1
                sent.append((request_id, item))
        return sent

    def added(self, request_ids: Sequence[bytes], entry_ids: Sequence[bytes]) -> None:
        """The requests ``request_ids`` are the stream entries ``entry_ids``
        now (those still waiting: a call may have ended meanwhile)."""
        with self.lock:
            for request_id, entry_id in zip(request_ids, entry_ids):
                if request_id in self._pending:
                    self._entries[request_id] = entry_id

    def unsent(self, sent: Sequence[Tuple[bytes, Item]]) -> None:
        """Stop waiting for answers to requests that did not reach Redis."""
        with self.lock:
            for request_id, _ in sent:
                self._pop(request_id)

    def ended(self, request_ids: Sequence[bytes]) -> None:
        """Calls ended other than by their answers: stop waiting for their
        inputs, and mark the entries of those sent for deletion.
        Idempotent: it may be told twice of one input."""
        with self.lock:
            for request_id in request_ids:
                entry_id = self._entries.pop(request_id, None)
                item = self._pop(request_id)
                if item is not None and entry_id is not None:
                    self._abandoned.append((item.level, entry_id))
                    self.abandon.set()

    def take_abandoned(self) -> List[Tuple[int, bytes]]:
        """The ``(level, entry id)`` of every request to delete, once each."""
        with self.lock:
            abandoned, self._abandoned = self._abandoned, []
        return abandoned

    def answered(self, request_ids: Sequence[bytes]) -> List[Optional[Item]]:
        """The inputs answered by ``request_ids``, taken out (``None`` for an
        id no call waits for: answered already, or given up). Holds the
        lock: call it under :attr:`lock`."""
        found = []
        for request_id in request_ids:
            self._entries.pop(request_id, None)
            found.append(self._pop(request_id))
        return found

    def waiting(self) -> List[Tuple[bytes, Item]]:
        """The requests whose calls still wait, by request id."""
        with self.lock:
            return [(request_id, item) for request_id, item in self._pending.items() if item.task.live()]

    def unanswered(self, level: Optional[int] = None) -> int:
        """Inputs sent and not answered yet (at ``level``, where given), of
        calls still running: each call's end takes its inputs out."""
        with self.lock:
            return len(self._pending) if level is None else self._by_level[level]

    def unanswered_up_to(self, level: int) -> int:
        """Inputs sent and not answered yet at ``level`` and every higher one."""
        with self.lock:
            return sum(self._by_level[: level + 1])

    def make_room(self, n: int, queued: int, limit: int, level: Optional[int] = None) -> None:
        """Raise :class:`QueueFullError` unless ``n`` more inputs fit under
        ``limit`` with those unanswered (at ``level``, where given: a
        level's bound) and the ``queued`` ones not sent yet."""
        waiting = self.unanswered(level) + queued
        if waiting + n <= limit:
            return
        if level is None:
            raise QueueFullError(
                f"{waiting} inputs of this process wait for an answer and max_queue is {limit}: "
                "retry later, add workers, or raise max_queue"
            )
        raise QueueFullError(
            f"{waiting} inputs of priority {level + 1} of this process wait for an answer and its bound is {limit}: "
            "retry later, add workers, or raise its bound (priority_max_queue or max_queue)"
        )

    def by_level(self) -> List[int]:
        """Inputs sent and not answered yet at each level, the highest first."""
        with self.lock:
            return list(self._by_level)

    def _pop(self, request_id: bytes) -> Optional[Item]:
        item = self._pending.pop(request_id, None)
        if item is not None:
            self._by_level[item.level] -= 1
        return item
