"""The worker positions of the process backend and what happens to each.

A :class:`Slot` is one worker position: its device, the process filling it
now, the batches sent to that process and not answered yet (at most two:
the one it runs and the next), and its state::

    new -> starting -> ready -> dead -> starting ...   (restarted, at once or after a backoff)
                 \\-> failed                            (init_model raised, or it kept dying while loading)
    any -> stopped                                      (the streamer closed)

The backend (:mod:`.process_backend`) does the processes' I/O and holds its lock
while it calls these; nothing here blocks.
"""

from __future__ import annotations

import signal
from collections import deque
from typing import Any, Deque, List, NamedTuple, Optional, Tuple

from ..batching.calls import Item
from ..errors import WorkerStartError
from ..options.config import MAX_SECONDS, DeviceId

__all__ = ["Slot", "Sent", "describe_exit"]

# A worker that dies this many times in a row before it is ready is given up.
_MAX_START_FAILURES = 3
_MAX_RESPAWN_DELAY = 5.0


def describe_exit(code: Optional[int]) -> str:
    """How a process ended, by its exit code, in words."""
    if code is None:
        return "stopped answering"
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    if code == 128 + signal.SIGTERM:  # a worker exits so on SIGTERM (process_worker)
        return "exited on SIGTERM"
    return f"exited with code {code}"


class Sent(NamedTuple):
    """A batch sent to a worker process."""

    batch_id: int
    items: List[Item]
    sent_at: float


class Slot:
    """One worker position: its device, and the process filling it now."""

    def __init__(self, index: int, device: Optional[DeviceId], hang_timeout: Optional[float]) -> None:
        self.index = index
        self.device = device
        self.process: Any = None  # a multiprocessing.Process, once started
        self.conn: Any = None  # its end of the pipe
        self.pid: Optional[int] = None
        self.state = "new"  # starting | ready | dead | failed | stopped
        self.batches: Deque[Sent] = deque()  # sent and not answered, oldest first (at most 2)
        self.last_done = 0.0
        self.start_failures = 0
        self.respawn_at: Optional[float] = None
        self.error: Optional[BaseException] = None
        self.generation = 0  # how many processes have filled this slot
        self.spawning = False  # a process for it is being started
        self.free: List[str] = []  # its result blocks copied out here, to name free with the next batch
        self.gone: List[str] = []  # this process's blocks unlinked since the last batch, for it to unmap
        self.hang_timeout = hang_timeout  # doubled at each kill for hanging, until a batch is answered
        self._configured_hang_timeout = hang_timeout

    def who(self, model: str) -> str:
        """The worker as the log lines name it, ``model`` the model's name."""
        return f"{model} worker {self.index}"

    def block_prefix(self, prefix: str) -> str:
        """The names of the current process's shared memory blocks start with this."""
        return f"{prefix}w{self.index}g{self.generation}_"

    def answered(self, batch_id: int, now: float) -> Optional[Tuple[Sent, float]]:
        """The process answered the batch ``batch_id``: the batch, and how
        long it ran (a batch sent while the worker ran another started when
        that one ended); ``None`` when it is not the batch the process runs."""
        if not self.batches or self.batches[0].batch_id != batch_id:
            return None
        sent = self.batches.popleft()
        self.hang_timeout = self._configured_hang_timeout  # it answers: whatever was taken for a hang was not one
        elapsed = now - max(sent.sent_at, self.last_done)
        self.last_done = now
        return sent, elapsed

    def ended(self, stopping: bool, now: float) -> Tuple[str, List[List[Item]]]:
        """The process is gone (its pipe closed, it is reaped): the state it
        was in, and the batches it held. The slot is then ``stopped`` (while
        ``stopping``), stays ``failed`` (its model could not load, and was
        reported), is ``failed`` for good after dying
        ``_MAX_START_FAILURES`` times in a row while loading, or is ``dead``,
        to be started again at :attr:`respawn_at` (at once after a worker
        that was ready; with a growing backoff after one that was loading)."""
        state, lost = self.state, [sent.items for sent in self.batches]
        self.batches.clear()
        self.conn = None
        if stopping:
            self.state = "stopped"
            return state, lost
        if state == "failed":
            return state, lost
        if state == "starting":
            self.start_failures += 1
        if self.start_failures >= _MAX_START_FAILURES:
            self.state = "failed"
            self.error = WorkerStartError(
                f"worker {self.index} died {self.start_failures} times while loading the model "
                f"(last time it {describe_exit(self.process.exitcode)}); see its output above"
            )
        else:
            self.state = "dead"
            delay = 0.0 if self.start_failures == 0 else 0.5 * 2 ** (self.start_failures - 1)
            self.respawn_at = now + min(delay, _MAX_RESPAWN_DELAY)
        return state, lost

    def hung(self, now: float) -> Optional[Tuple[float, float]]:
        """Whether the process has run one batch for its ``hang_timeout`` or
        more while none of that batch's callers waits any longer: then how
        long, and the limit it passed (the next is twice that, until it
        answers a batch); else ``None``."""
        limit = self.hang_timeout
        if limit is None or self.state != "ready" or self.conn is None or not self.batches:
            return None
        running = self.batches[0]
        seconds = now - max(running.sent_at, self.last_done)
        if seconds < limit or any(item.task.live() for item in running.items):
            return None
        self.hang_timeout = min(2 * limit, MAX_SECONDS)
        return seconds, limit
