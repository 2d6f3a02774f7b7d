"""What a worker process tells the process backend over its pipe, and what
is done with each message: ``ready`` (the model loaded: the slot takes
batches), ``init_error`` (it could not load: the slot is given up) and
``done`` (a batch's outcomes, delivered to their calls).

The collector thread of :mod:`.process_backend` reads a message here once
``multiprocessing.connection.wait`` says one is there; deaths, restarts and
hangs stay with the backend, which owns the slots' lock.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Callable, List, Optional, Tuple

from ..batching.calls import deliver
from ..batching.scheduler import Scheduler
from ..green import Condition
from ..managed_model import ready_line
from ..options.config import BatchingConfig
from ..streamer import logger
from .process_slots import Slot
from .process_worker import decode_exception, decode_outcome
from .shared_memory import PeerBlocks, block_names

__all__ = ["WorkerMessages"]


class WorkerMessages:
    """Reads the messages of one backend's workers.

    ``lock`` and ``changed`` are the backend's (its slots' lock and the
    condition that says a slot changed state); ``died`` is called for a
    worker whose pipe broke, ``check_broken`` once a worker could not load
    (every worker failing breaks the streamer). :attr:`scheduler` is set as
    the backend starts, before the first message can arrive."""

    def __init__(
        self,
        name: str,
        config: BatchingConfig,
        lock: threading.Lock,
        changed: Condition,
        peer: PeerBlocks,
        died: Callable[[Slot], None],
        check_broken: Callable[[], None],
    ) -> None:
        self._name = name
        self._config = config
        self._lock = lock
        self._changed = changed
        self._peer = peer
        self._died = died
        self._check_broken = check_broken
        self.scheduler: Scheduler = None  # type: ignore[assignment]  # set by the backend's start()

    def read(self, slot: Slot) -> None:
        """Read and act on one message from ``slot``'s worker (one is there)."""
        try:
            message = slot.conn.recv()
        except (EOFError, OSError):
            self._died(slot)
            return
        kind = message[0]
        if kind == "done":
            self._peer.forget(message[5])  # its blocks it has unlinked
            self._on_done(slot, message[1], message[2], message[3], message[4], message[6])
        elif kind == "ready":
            self._on_ready(slot, message[1], message[2])
        elif kind == "init_error":
            self._on_init_error(slot, message[1])

    def _on_ready(self, slot: Slot, pid: int, facts: Any) -> None:
        # The line is written before wait_ready() can return: once it
        # says ready, the log says so too.
        config = self._config
        line = ready_line(facts, config.batch_size, config.max_latency)
        logger.info("%s (pid %d): %s", slot.who(self._name), pid, line)
        with self._lock:
            slot.state, slot.start_failures, slot.pid = "ready", 0, pid
            self._changed.notify_all()
        self.scheduler.add_slot()

    def _on_init_error(self, slot: Slot, payload: bytes) -> None:
        error = decode_exception(payload)
        with self._lock:
            slot.state, slot.error = "failed", error
            self._changed.notify_all()
        logger.error(
            "%s could not load the model and is not restarted: %s\n%s",
            slot.who(self._name),
            error,
            error.__cause__,
        )
        self._check_broken()

    def _on_done(
        self,
        slot: Slot,
        batch_id: int,
        wire: List[Any],
        ran_out: Optional[List[Tuple[int, int]]],
        model_seconds: float,
        oom_splits: int,
    ) -> None:
        scheduler = self.scheduler
        with self._lock:
            now = time.monotonic()
            answered = slot.answered(batch_id, now)
            if answered is None:
                logger.error("worker %d answered batch %d it was not running; ignored", slot.index, batch_id)
                return
            sent, elapsed = answered
            # Counted done under the lock that run() picks a worker under:
            # the dispatcher never sees this worker holding a batch it has
            # answered, which it would hand a batch run() finds no worker
            # for, again and again until this thread got to count it (under
            # gevent, whose locks are not fair, for seconds on end).
            scheduler.learn(sent.items, ran_out is not None, ran_out or (), oom_splits)
            scheduler.batch_done(len(sent.items), elapsed, len(slot.batches))
        stats = scheduler.stats
        if stats is not None and model_seconds > 0:  # 0: no input of it could be unpickled
            levels = [item.level for item in sent.items] if stats.levels else None
            stats.batch_ran(now - model_seconds, model_seconds, [item.arrival for item in sent.items], levels)
        outcomes = [decode_outcome(ok, payload, self._peer) for ok, payload in wire]
        freed = [name for ok, payload in wire if ok for name in block_names(payload)]
        if freed:
            with self._lock:
                slot.free.extend(freed)
        deliver(sent.items, outcomes)
