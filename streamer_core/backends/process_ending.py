"""How the process backend ends worker processes other than by their own
death: :class:`HangWatch` kills a worker taken for hung (its death is then
handled as any other, so it is restarted), and :func:`stop_workers` asks
every worker to stop as the streamer closes, then terminates and kills the
ones that do not in time.

Only the backend's collector thread reaps workers: the code here signals a
process only while the collector has not reaped it, so its pid is still
the worker's.
"""

from __future__ import annotations

import threading
import time
from typing import Any, List, Optional

from ..green import Condition
from ..streamer import logger
from .process_slots import Slot

__all__ = ["HangWatch", "ask_to_stop", "stop_workers"]


class HangWatch:
    """When to look for hung workers next, and the killing of those found
    (``hang_timeout`` seconds, or ``None``: never)."""

    def __init__(self, hang_timeout: Optional[float]) -> None:
        self._hang_timeout = hang_timeout
        self._next_check = 0.0

    def next_check(self) -> Optional[float]:
        """When the collector must wake to look (a batch sent meanwhile may
        never be answered), as a ``time.monotonic()`` value; ``None``: never."""
        return None if self._hang_timeout is None else self._next_check

    def kill_hung(self, slots: List[Slot], lock: threading.Lock, model: str) -> None:
        """Kill each worker that has run one batch for ``hang_timeout``
        seconds or more while none of that batch's callers waits any longer
        (a deadlock, a GPU that stopped answering): its death is handled as
        any other, so it is restarted and its next batch runs again. A
        batch with a caller still waiting is left to run, however long.
        Each kill doubles the slot's ``hang_timeout`` until it answers a
        batch, so a batch that is only slow (a first call that compiles)
        ends up finishing rather than being killed for good."""
        now = time.monotonic()
        if self._hang_timeout is None or now < self._next_check:
            return
        self._next_check = now + min(1.0, self._hang_timeout / 4)
        hung = []
        with lock:
            for slot in slots:
                overdue = slot.hung(now)
                if overdue is not None:
                    hung.append((slot, slot.process, *overdue))
        for slot, process, seconds, limit in hung:
            logger.error(
                "%s (pid %d) has run one batch for %.0fs and every caller of it has given up: taken for "
                "hung (hang_timeout=%gs), it is killed and restarted; next time it gets %gs, until it answers "
                "(raise hang_timeout if batches take that long)",
                slot.who(model),
                process.pid,
                seconds,
                limit,
                slot.hang_timeout,
            )
            process.kill()


def ask_to_stop(slots: List[Slot]) -> None:
    """Tell every worker to stop, and every slot not to start again (under
    the backend's lock)."""
    for slot in slots:
        slot.respawn_at = None
        if slot.conn is not None:
            try:
                slot.conn.send(("stop",))
            except (OSError, ValueError):
                pass


def stop_workers(slots: List[Slot], changed: Condition, collector: threading.Thread, deadline: float) -> None:
    """Wait until the collector has reaped every worker (told to stop, see
    :func:`ask_to_stop`) and no slot is starting one; past ``deadline``,
    terminate those left, then a second later kill them. ``changed`` is the
    backend's condition over its slots' lock, notified as a slot changes."""
    for escalate in ("terminate", "kill", None):
        with changed:
            while collector.is_alive() and any(s.conn is not None or s.spawning for s in slots):
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                changed.wait(remaining)
            lingering: List[Any] = [s.process for s in slots if s.conn is not None]
        if not lingering or escalate is None:
            break
        if not collector.is_alive():  # nobody else will reap them
            for process in lingering:
                process.join(max(0.0, deadline - time.monotonic()))
        for process in lingering:
            if process.exitcode is None:
                logger.warning("worker pid %d did not stop in time; %s", process.pid, escalate)
                getattr(process, escalate)()
        deadline = time.monotonic() + 1.0
