"""The process backend: the model runs in spawned worker processes.

How data moves::

    caller threads           this process                              worker processes
    --------------           ------------                              ----------------
    submit(batch)            Scheduler (FIFO of items, batching rule)
      pickle each input ---> queue
      (large arrays into
      shared memory)
                             dispatcher thread
                               next_batch() when a worker is idle (or busy,
                               with a full batch waiting: it starts it next)
                               ("batch", id, [pickled inputs]) --pipe-->  worker_main: run_batch(model)
                             collector thread                  <--pipe--  ("done", id, [outcomes])
                               batch_done(), deliver() -> futures
                               waits on every pipe and every process sentinel:
                               a death reruns its batch's items alone (or fails
                               them after max_item_crashes), queues the batch
                               sent ahead again, and respawns the worker; kills
                               a worker stuck past hang_timeout (then: a death)

Batches are formed here, in the parent, and each worker holds at most two
(the one it runs and the next), so the parent always knows which inputs a
dead worker took with it. Workers exit on their own when this process dies
(they watch their parent). A slot's life is :mod:`.process_slots`'.

Numpy arrays and CPU tensors of ``shared_memory_min_bytes`` or more travel
through shared memory instead of the pipe: copied once on each side, and
viewed in place by the model (``shared_memory.py`` says how and who frees
what).
"""

from __future__ import annotations

import itertools
import multiprocessing
import multiprocessing.connection
import os
import pickle
import threading
import time
import weakref
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Sequence, Tuple

from streamer_core.batching.scheduler import Scheduler, _Item, deliver, live_items
from streamer_core.batching.shaping import batch_cost
from streamer_core.options.config import BatchingConfig, DeviceId, shown_device
from streamer_core.telemetry.tracing import to_traceparent

from ..errors import StreamerError, WorkerStartError
from ..green import Condition
from ..managed_model import ready_line
from ..streamer import Backend, callable_name, logger
from ..threads import background
from .process_slots import Sent, Slot, describe_exit
from .process_worker import IN_WORKER_ENV, BatchTrace, decode_exception, decode_outcome, worker_main
from .shared_memory import BlockPool, PeerBlocks, block_names, encode_input, new_prefix, unlink_leftovers, wire_of
from .shared_memory import available as shared_memory_available
from .spawning import spawn_context

if TYPE_CHECKING:
    pass

__all__ = ["ProcessBackend"]

_ctx = spawn_context()

# Every backend that has started workers in this process, for _after_fork_in_child.
_started: weakref.WeakSet[ProcessBackend] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    """In a process just forked from one with workers: they are the parent's
    (see streamer.py). Close this process's copies of their pipes, so that
    they still see the parent go when it does, and take them off
    ``multiprocessing``'s list of this process's children: as this process
    exits, ``multiprocessing`` would send them SIGTERM. Nothing else runs
    in the new process yet: no lock is taken."""
    children = getattr(multiprocessing.process, "_children", None)
    for backend in list(_started):
        for slot in backend._slots:
            if children is not None:
                children.discard(slot.process)
            if slot.conn is not None:
                try:
                    slot.conn.close()
                except OSError:
                    pass


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


class ProcessBackend(Backend):
    name = "process"
    copies_inputs = True

    def __init__(
        self,
        target: Any,
        worker_num: int,
        devices: Optional[Sequence[DeviceId]],
        init_args: Sequence[Any],
        init_kwargs: Dict[str, Any],
        config: BatchingConfig,
        shared_memory_min_bytes: Optional[int],
        hang_timeout: Optional[float],
        name: str,
    ) -> None:
        self._name = name  # the model's, for the log lines
        try:
            self._spec = pickle.dumps((target, tuple(init_args), dict(init_kwargs)), pickle.HIGHEST_PROTOCOL)
        except Exception as exc:
            raise TypeError(
                f"{callable_name(target)} and its model_init_args/model_init_kwargs must be picklable: "
                "spawned workers import the model by name, so define it at module level "
                f"(not a lambda or a nested function) and pass plain init arguments ({exc})"
            ) from exc
        self._config = config
        self._hang_timeout = hang_timeout
        self._next_hang_check = 0.0
        self._isolate = config.isolate_errors
        self._tracing = config.tracing
        self._min_bytes = shared_memory_min_bytes if shared_memory_available() else None
        self._prefix = new_prefix("")
        self._pool = BlockPool(self._prefix + "p_") if self._min_bytes is not None else None
        self._peer = PeerBlocks()
        # The cores workers run on, as now: a web process pinned later
        # (streamer_core.web.affinity) does not hand its one core down.
        self._cpus = frozenset(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
        self._slots = [Slot(i, devices[i % len(devices)] if devices else None, hang_timeout) for i in range(worker_num)]
        self._lock = threading.Lock()
        self._changed = Condition(self._lock)  # a slot changed state
        self._wake_r, self._wake_w = _ctx.Pipe(duplex=False)
        self._batch_ids = itertools.count()
        self._stopping = False
        self._scheduler: Scheduler = None  # type: ignore[assignment]  # set by start(), before any thread uses it
        self._collector = background(self._collect, "streamer-process-collect")

    # -- starting ------------------------------------------------------------

    def _who(self, slot: Slot) -> str:  # a worker as the log lines name it
        return f"{self._name} worker {slot.index}"

    def start(self, scheduler: Scheduler) -> None:
        if os.environ.get(IN_WORKER_ENV):
            raise StreamerError(
                "a Streamer was created inside one of its own worker processes, most likely by importing the "
                "module that makes it; create it under `if __name__ == '__main__':` or lazily on first use"
            )
        self._scheduler = scheduler
        _started.add(self)
        for slot in self._slots:
            self._spawn(slot)
        self._collector.start()

    def _spawn(self, slot: Slot) -> None:
        with self._lock:
            if self._stopping:
                return  # a respawn that close() overtook
            slot.spawning = True
        parent_conn, child_conn = _ctx.Pipe()
        # Under gevent's monkey-patching the pipe is a socketpair made
        # non-blocking for the hub, and the flag travels with the descriptor:
        # the worker's reads failed with EAGAIN (it took that for its parent
        # gone and exited) and a send to a full pipe was dropped. Both ends
        # block, as they do unpatched; the collector reads only once wait()
        # has said a message is there.
        for conn in (parent_conn, child_conn):
            os.set_blocking(conn.fileno(), True)
        with self._lock:
            slot.generation += 1
            slot.free, slot.gone = [], []
            min_bytes = self._min_bytes
            shared = (slot.block_prefix(self._prefix), min_bytes) if min_bytes is not None else None
        config = self._config
        trace_as = (self._name, f"worker {slot.index}") if config.tracing else None
        args = (
            child_conn, self._spec, slot.device, os.getpid(), self._isolate, config.oom_errors, shared, self._cpus,
            trace_as,
        )  # fmt: skip
        process = _ctx.Process(
            target=worker_main,
            args=args,
            name=f"streamer-worker-{slot.index}",
            daemon=True,
        )
        try:
            process.start()
        except BaseException:
            child_conn.close()
            parent_conn.close()
            with self._lock:
                slot.spawning = False
                self._changed.notify_all()
            raise
        child_conn.close()
        with self._lock:
            slot.spawning = False
            self._changed.notify_all()
            slot.process, slot.conn, slot.pid = process, parent_conn, process.pid
            slot.state, slot.respawn_at = "starting", None
            slot.batches.clear()
            if self._stopping:  # stop() ran while it started: it waits for this one too
                try:
                    parent_conn.send(("stop",))
                except (OSError, ValueError):
                    pass
        logger.info("%s (pid %d) starting on device %s", self._who(slot), process.pid, shown_device(slot.device))

    def encode(self, value: Any, index: int) -> Any:
        return encode_input(value, index, self._pool, self._min_bytes or 0)

    # -- running batches -----------------------------------------------------

    def run(self, items: List[_Item], held: int) -> None:
        scheduler = self._scheduler
        assert scheduler is not None
        items = live_items(items, scheduler.stats)
        with self._lock:
            slot = next((s for s in self._slots if s.state == "ready" and len(s.batches) == held), None)
            if slot is None or not items:
                # The worker counted on died after the batch was formed, or
                # every call in it was given up meanwhile.
                scheduler.batch_returned(items, held)
                return
            sent = Sent(next(self._batch_ids), items, time.monotonic())
            slot.batches.append(sent)
            if self._pool is not None:
                gone = self._pool.dropped()
                for other in self._slots if gone else ():
                    if other.state == "ready":  # one still starting has mapped none of them
                        other.gone.extend(gone)
            wires = [wire_of(item.value) for item in items]
            trace = self._trace_of(items) if self._tracing else None
            conn, message = slot.conn, ("batch", sent.batch_id, wires, slot.free, slot.gone, trace)
            slot.free, slot.gone = [], []
        try:
            conn.send(message)
        except (OSError, ValueError):
            pass  # the worker is dead; the collector sees it and reruns the batch

    def _trace_of(self, items: List[_Item]) -> BatchTrace:
        """What a worker needs to trace a batch: its cost, and each input's
        call as a ``traceparent`` and the call's arrival (ns since the epoch)."""
        calls = [item.task.trace for item in items]
        cost = batch_cost(self._config.batch_cost, [item.cost for item in items])
        return cost, [None if call is None else (to_traceparent(call), call.arrived_ns) for call in calls]

    # -- the collector thread ------------------------------------------------

    def _collect(self) -> None:
        while True:
            with self._lock:
                watched: Dict[Any, Slot] = {}
                for slot in self._slots:
                    if slot.conn is not None:
                        watched[slot.conn] = slot
                        watched[slot.process.sentinel] = slot
                if self._stopping and not watched:
                    return
                wakeups = [s.respawn_at for s in self._slots if s.respawn_at is not None]
                if self._hang_timeout is not None:  # a batch sent meanwhile may never be answered
                    wakeups.append(self._next_hang_check)
            timeout = None if not wakeups else max(0.0, min(wakeups) - time.monotonic())
            try:
                ready = multiprocessing.connection.wait([*watched, self._wake_r], timeout)
                for obj in ready:
                    if obj is self._wake_r:
                        while self._wake_r.poll():
                            self._wake_r.recv()
                        continue
                    slot = watched[obj]
                    if slot.conn is None or slot.process.sentinel not in watched:
                        continue
                    if obj is slot.conn:
                        self._read(slot)
                    else:  # the process ended: take what it sent before dying, then bury it
                        while slot.conn is not None and slot.conn.poll():
                            self._read(slot)
                        self._died(slot)
                self._respawn_due()
                self._kill_hung()
            except Exception:
                logger.exception("error in the worker collector thread; it keeps running")

    def _read(self, slot: Slot) -> None:
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
            # The line is written before wait_ready() can return: once it
            # says ready, the log says so too.
            config = self._config
            line = ready_line(message[2], config.batch_size, config.max_latency)
            logger.info("%s (pid %d): %s", self._who(slot), message[1], line)
            with self._lock:
                slot.state, slot.start_failures, slot.pid = "ready", 0, message[1]
                self._changed.notify_all()
            self._scheduler.add_slot()
        elif kind == "init_error":
            error = decode_exception(message[1])
            with self._lock:
                slot.state, slot.error = "failed", error
                self._changed.notify_all()
            logger.error(
                "%s could not load the model and is not restarted: %s\n%s",
                self._who(slot),
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
        scheduler = self._scheduler
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

    def _died(self, slot: Slot) -> None:
        with self._lock:
            if slot.conn is None:
                return
            process = slot.process
            slot.conn.close()
            process.join(1.0)
            self._release_blocks(slot)
            state, lost = slot.ended(self._stopping, time.monotonic())
            self._changed.notify_all()
            if self._stopping or state == "failed":
                # Stopping; or init_model raised, was reported, and the worker
                # exited: a model that cannot load is not started again.
                return
        reason = f"{self._who(slot)} (pid {slot.pid}) {describe_exit(process.exitcode)}"
        logger.warning("%s; %s", reason, "restarting it" if slot.state == "dead" else "giving it up")
        if state == "ready":
            # A worker runs its batches in turn: only the first can have
            # reached the model. Outside this backend's lock: it may fail
            # calls, whose done-callbacks may ask this backend for its workers.
            self._scheduler.worker_lost(lost[:1], reason + " while it held a batch with this input", lost[1:])
        self._check_broken()

    def _kill_hung(self) -> None:
        """Kill each worker that has run one batch for ``hang_timeout``
        seconds or more while none of that batch's callers waits any longer
        (a deadlock, a GPU that stopped answering): its death is handled as
        any other, so it is restarted and its next batch runs again. A
        batch with a caller still waiting is left to run, however long.
        Each kill doubles the slot's ``hang_timeout`` until it answers a
        batch, so a batch that is only slow (a first call that compiles)
        ends up finishing rather than being killed for good."""
        now = time.monotonic()
        if self._hang_timeout is None or now < self._next_hang_check:
            return
        self._next_hang_check = now + min(1.0, self._hang_timeout / 4)
        hung = []
        with self._lock:
            for slot in self._slots:
                overdue = slot.hung(now)
                if overdue is not None:
                    hung.append((slot, slot.process, *overdue))
        for slot, process, seconds, limit in hung:
            logger.error(
                "%s (pid %d) has run one batch for %.0fs and every caller of it has given up: taken for "
                "hung (hang_timeout=%gs), it is killed and restarted; next time it gets %gs, until it answers "
                "(raise hang_timeout if batches take that long)",
                self._who(slot),
                process.pid,
                seconds,
                limit,
                slot.hang_timeout,
            )
            process.kill()

    def _release_blocks(self, slot: Slot) -> None:
        """Unmap and unlink what the slot's process left in shared memory:
        it is dead, or told to stop, so nothing of it is read again."""
        prefix = slot.block_prefix(self._prefix)
        self._peer.forget_prefix(prefix)
        if self._min_bytes is not None:
            unlink_leftovers(prefix)

    def _respawn_due(self) -> None:
        now = time.monotonic()
        with self._lock:
            due = [s for s in self._slots if s.respawn_at is not None and s.respawn_at <= now and not self._stopping]
            for slot in due:
                slot.respawn_at = None
        for slot in due:
            try:
                self._spawn(slot)
            except Exception as exc:
                logger.exception("could not start worker %d again", slot.index)
                with self._lock:
                    slot.state, slot.error = "failed", WorkerStartError(f"could not start worker {slot.index}: {exc!r}")
                self._check_broken()

    def _check_broken(self) -> None:
        with self._lock:
            if not all(slot.state == "failed" for slot in self._slots):
                return
            first = self._slots[0].error
            self._changed.notify_all()

        def make_error() -> BaseException:
            error = WorkerStartError(f"no worker could start, so no call can run: {first}")
            error.__cause__ = getattr(first, "__cause__", None) or first
            return error

        logger.error("every worker failed to start; calls fail with WorkerStartError")
        self._scheduler.set_broken(make_error)

    # -- the streamer's queries ------------------------------------------------

    def wait_ready(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        with self._changed:
            while True:
                states = [slot.state for slot in self._slots]
                if all(state in ("ready", "failed") for state in states):
                    break
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self._changed.wait(remaining)
        if all(state == "failed" for state in states):
            self._check_broken()
            raise WorkerStartError(f"no worker could start: {self._slots[0].error}") from self._slots[0].error
        return all(state == "ready" for state in states)

    def workers_now(self) -> int:
        with self._lock:
            return sum(1 for slot in self._slots if slot.state == "ready" and slot.conn is not None)

    def workers_by_device(self) -> Dict[str, int]:
        counts: Dict[str, int] = {}
        with self._lock:
            for slot in self._slots:
                device = shown_device(slot.device)
                counts[device] = counts.get(device, 0) + (slot.state == "ready" and slot.conn is not None)
        return counts

    def pids(self) -> List[int]:
        with self._lock:
            return [slot.pid for slot in self._slots if slot.conn is not None and slot.pid is not None]

    # -- stopping --------------------------------------------------------------

    def stop(self, deadline: float) -> None:
        # Only the collector thread reaps workers: a second thread joining the
        # same process could find it already reaped and signal a pid that is
        # no longer ours. Here we ask them to stop, wait for the collector to
        # see them go, and signal only the ones it has not reaped (so their pid
        # is still theirs) once the deadline passes.
        with self._lock:
            self._stopping = True
            for slot in self._slots:
                slot.respawn_at = None
                if slot.conn is not None:
                    try:
                        slot.conn.send(("stop",))
                    except (OSError, ValueError):
                        pass
        self._wake_collector()
        for escalate in ("terminate", "kill", None):
            with self._changed:
                while self._collector.is_alive() and any(s.conn is not None or s.spawning for s in self._slots):
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        break
                    self._changed.wait(remaining)
                lingering = [s.process for s in self._slots if s.conn is not None]
            if not lingering or escalate is None:
                break
            if not self._collector.is_alive():  # nobody else will reap them
                for process in lingering:
                    process.join(max(0.0, deadline - time.monotonic()))
            for process in lingering:
                if process.exitcode is None:
                    logger.warning("worker pid %d did not stop in time; %s", process.pid, escalate)
                    getattr(process, escalate)()
            deadline = time.monotonic() + 1.0
        self._wake_collector()
        if threading.current_thread() is not self._collector:
            self._collector.join(2.0)
        if not self._collector.is_alive():
            self._wake_r.close()
            self._wake_w.close()
        for slot in self._slots:
            if slot.generation:
                self._release_blocks(slot)
        self._peer.close()
        if self._pool is not None:
            self._pool.close()

    def _wake_collector(self) -> None:
        try:
            self._wake_w.send(None)
        except (OSError, ValueError):
            pass
