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
(they watch their parent). A slot's life is :mod:`.process_slots`'; how a
worker is started :mod:`.process_launch`'s, what it sends back is read by
:mod:`.process_messages`, and how it is killed when hung or stopped at
close is :mod:`.process_ending`'s.

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
import threading
import time
import weakref
from typing import Any, Callable, Dict, List, Optional, Sequence

from ..batching.calls import Item, live_items
from ..batching.scheduler import Scheduler
from ..batching.shaping import batch_cost
from ..errors import StreamerError, WorkerStartError
from ..green import Condition
from ..options.config import BatchingConfig, DeviceId, shown_device
from ..streamer import Backend, logger
from ..telemetry.tracing import to_traceparent
from ..threads import background
from .process_ending import HangWatch, ask_to_stop, stop_workers
from .process_launch import Launcher, pickled_spec
from .process_messages import WorkerMessages
from .process_slots import Sent, Slot, describe_exit
from .process_worker import IN_WORKER_ENV, BatchTrace
from .shared_memory import BlockPool, PeerBlocks, encode_input, new_prefix, unlink_leftovers, wire_of
from .shared_memory import available as shared_memory_available
from .spawning import spawn_context

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


#: How long a start that failed part-way gives the workers it did start to stop, seconds.
_FAILED_START_STOP_S = 5.0


def _weakly(method: Callable[..., None]) -> Callable[..., None]:
    """``method``, called only while its object lives. The helpers a backend
    hands its methods to hold no cycle back to it, so a backend dropped is
    freed at once, and the pipes of its workers' processes closed with it,
    not at the cyclic collector's next pass."""
    ref = weakref.WeakMethod(method)

    def call(*args: Any) -> None:
        bound = ref()
        if bound is not None:
            bound(*args)

    return call


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
        spec = pickled_spec(target, init_args, init_kwargs)
        self._config = config
        self._hangs = HangWatch(hang_timeout)
        self._tracing = config.tracing
        self._min_bytes = shared_memory_min_bytes if shared_memory_available() else None
        self._prefix = new_prefix("")
        self._pool = BlockPool(self._prefix + "p_") if self._min_bytes is not None else None
        self._peer = PeerBlocks()
        self._launcher = Launcher(spec, config, name, self._prefix, self._min_bytes)
        self._slots = [Slot(i, devices[i % len(devices)] if devices else None, hang_timeout) for i in range(worker_num)]
        self._lock = threading.Lock()
        self._changed = Condition(self._lock)  # a slot changed state
        # What the workers send, read by the collector thread.
        self._messages = WorkerMessages(
            name, config, self._lock, self._changed, self._peer, _weakly(self._died), _weakly(self._check_broken)
        )
        self._wake_r, self._wake_w = _ctx.Pipe(duplex=False)
        self._batch_ids = itertools.count()
        self._stopping = False
        self._scheduler: Scheduler = None  # type: ignore[assignment]  # set by start(), before any thread uses it
        self._collector = background(self._collect, "streamer-process-collect")

    # -- starting ------------------------------------------------------------

    def start(self, scheduler: Scheduler) -> None:
        if os.environ.get(IN_WORKER_ENV):
            raise StreamerError(
                "a Streamer was created inside one of its own worker processes, most likely by importing the "
                "module that makes it; create it under `if __name__ == '__main__':` or lazily on first use"
            )
        self._scheduler = self._messages.scheduler = scheduler
        _started.add(self)
        try:
            for slot in self._slots:
                self._spawn(slot)
        except BaseException:
            # No streamer will be made to close this: stop the workers that
            # did start and close the pipes now, then say why.
            self._collector.start()
            self.stop(time.monotonic() + _FAILED_START_STOP_S)
            raise
        self._collector.start()

    def _spawn(self, slot: Slot) -> None:
        with self._lock:
            if self._stopping:
                return  # a respawn that close() overtook
            slot.spawning = True
        try:
            process, parent_conn = self._launcher.launch(slot, self._lock)
        except BaseException:
            with self._lock:
                slot.spawning = False
                self._changed.notify_all()
            raise
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
        logger.info("%s (pid %d) starting on device %s", slot.who(self._name), process.pid, shown_device(slot.device))

    def encode(self, value: Any, index: int) -> Any:
        return encode_input(value, index, self._pool, self._min_bytes or 0)

    # -- running batches -----------------------------------------------------

    def run(self, items: List[Item], held: int) -> None:
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

    def _trace_of(self, items: List[Item]) -> BatchTrace:
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
                hang_check = self._hangs.next_check()
                if hang_check is not None:  # a batch sent meanwhile may never be answered
                    wakeups.append(hang_check)
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
                        self._messages.read(slot)
                    else:  # the process ended: take what it sent before dying, then bury it
                        while slot.conn is not None and slot.conn.poll():
                            self._messages.read(slot)
                        self._died(slot)
                self._respawn_due()
                self._hangs.kill_hung(self._slots, self._lock, self._name)
            except Exception:
                logger.exception("error in the worker collector thread; it keeps running")

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
        reason = f"{slot.who(self._name)} (pid {slot.pid}) {describe_exit(process.exitcode)}"
        logger.warning("%s; %s", reason, "restarting it" if slot.state == "dead" else "giving it up")
        if state == "ready":
            # A worker runs its batches in turn: only the first can have
            # reached the model. Outside this backend's lock: it may fail
            # calls, whose done-callbacks may ask this backend for its workers.
            self._scheduler.worker_lost(lost[:1], reason + " while it held a batch with this input", lost[1:])
        self._check_broken()

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
            ask_to_stop(self._slots)
        self._wake_collector()
        stop_workers(self._slots, self._changed, self._collector, deadline)
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
