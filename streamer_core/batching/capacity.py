"""How much work the scheduler's workers hold: :class:`WorkerCapacity`.

Each worker holds up to two batches: the one it runs and, when a full
batch is waiting, the next one, so it never idles between batches under
load (:meth:`~streamer_core.batching.scheduler.Scheduler.next_batch`). The
scheduler counts, under its lock, the workers holding none and one, and
the batches handed out and not yet done or lost (what closing waits for).
"""

from __future__ import annotations

__all__ = ["WorkerCapacity"]


class WorkerCapacity:
    """Workers by how many batches they hold, and the batches out."""

    __slots__ = ("idle", "busy", "in_flight")

    def __init__(self) -> None:
        self.idle = 0  # workers holding no batch
        self.busy = 0  # workers holding one batch (room for a full one more)
        self.in_flight = 0  # batches handed out and not yet done or lost

    def added(self) -> None:
        """A worker became ready to take batches."""
        self.idle += 1

    def handed(self, held: int) -> None:
        """A worker holding ``held`` batches was handed one more."""
        self._move(held, held + 1)
        self.in_flight += 1

    def done(self, held_after: int) -> None:
        """A worker finished a batch, and holds ``held_after`` now."""
        self._move(held_after + 1, held_after)
        self.in_flight -= 1

    def returned(self, held: int) -> None:
        """A batch meant for a worker holding ``held`` could not be handed to it."""
        self._move(held + 1, held)
        self.in_flight -= 1

    def lost(self, held: int) -> None:
        """A worker died holding ``held`` batches."""
        self._count(held, -1)
        self.in_flight -= held

    def _move(self, before: int, after: int) -> None:
        self._count(before, -1)
        self._count(after, +1)

    def _count(self, held: int, delta: int) -> None:
        if held == 0:
            self.idle += delta
        elif held == 1:
            self.busy += delta
