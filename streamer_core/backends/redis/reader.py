"""A Redis worker's reading: the requests its reader thread takes from the
stream while the model runs, and how they reach the model's thread.

:class:`Handover` is what the two threads share, under one condition: a
:class:`~streamer_core.batching.former.BatchFormer` of the requests read (so a
worker forms its batches by the in-process rule), whether the model is
running and on how many, and whether the reader has stopped. :class:`Reader`
is the reader thread's loop: how much to read ahead, when to block, taking
over the requests of dead workers (:mod:`.intake`), riding out Redis
blips.

With priority levels (a stream per level) the reader reads the highest
level's stream first and a lower one only for the room left, so every
worker reads a level's requests before a lower level's; what it holds is a
former whose line is a :class:`~streamer_core.batching.levels.LeveledQueue`,
so its next batch is formed by the in-process rule. A worker whose model is busy and whose read-ahead
holds lower levels' requests keeps looking at the higher streams, and
reads what would go into its next batch ahead of them: an interactive
request waits for the running batch and its own, not for the bulk batch
read ahead.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from typing import Any, Callable, List, Optional, Tuple

from ...batching.former import BatchFormer
from ...batching.levels import waiting_queue
from ...batching.queues import WaitingQueue
from ...green import Condition
from ...options.config import BatchingConfig
from ...options.redis_address import RedisAddress
from .connection import MAX_BACKOFF_S, LoopErrors, broker_errors, broker_problem
from .damage import is_wrong_type, repair_key
from .intake import Input, Intake, ServerClock
from .wire import GROUP, Keys

__all__ = ["Handover", "Reader"]

logger = logging.getLogger("streamer_core.redis")

# How long one blocking read waits for requests (ms): also how soon an idle
# reader notices it should stop.
_BLOCK_MS = 500
# How often a worker holding a partial batch looks for companions (seconds).
_HOLD_POLL_S = 0.001


class Handover:
    """The requests read and not yet run, and when the model's thread takes
    them as a batch: by the in-process rule, through a
    :class:`~streamer_core.batching.former.BatchFormer`. A request taken over from a
    dead worker runs alone, and the next is claimed only once it has run.
    Batches are shaped by cost as in-process; the costs may be the web
    side's, so a learned cap has no ceiling but the budget. A request whose
    deadline passes while it waits here (by the server's ``clock``, once the
    worker has one) is dropped before it is batched, and kept in
    ``expired`` for the model's thread to acknowledge unrun; so is one that
    a batch forming now could not answer in time, its deadline sooner than
    the fastest of this worker's latest batches could end, as in-process
    (:mod:`streamer_core.batching.scheduler`)."""

    def __init__(self, config: BatchingConfig) -> None:
        self.cond = Condition()
        self.clock: Optional[ServerClock] = None
        self.expired: List[Input] = []
        queue: WaitingQueue[Input] = waiting_queue(config)  # with priority levels, one line per level
        self.former: BatchFormer[Input] = BatchFormer(config, True, self._live, self.expired.append, queue=queue)
        #: With priority levels, the same former.
        self.leveled: Optional[BatchFormer[Input]] = self.former if config.priority_levels > 1 else None
        self.orphan_in_hand = False  # one at a time, each run before the next is claimed
        self.reader_done = False
        self.running = False  # the model is running a batch
        self.running_size = 0  # of how many requests
        self.delivered_at_ms = 0.0  # when the last batch was answered, by the server's clock
        self._late_ms = 0.0  # while a batch forms: how long before its deadline a request is late

    def _live(self, held: Input) -> bool:
        """Whether the caller of ``held`` still waits: its deadline has not passed."""
        clock = self.clock
        request = held.request
        return clock is None or clock.now_ms(refresh=False) + self._late_ms <= request.created_ms() + request.timeout_ms

    def take_expired(self) -> List[Input]:
        """The requests dropped as expired since last asked."""
        with self.cond:
            expired, self.expired[:] = list(self.expired), []
        return expired

    # -- the reader's side ---------------------------------------------------------

    def add(self, inputs: List[Input], alone: bool = False) -> None:
        """Hand over requests just read (``alone``: one taken over from a dead worker)."""
        now = time.monotonic()
        former = self.former
        with self.cond:
            if alone:
                former.add_alone(inputs)
                self.orphan_in_hand = True
            else:
                former.add(inputs)
                # Only requests added to the stream since the last answers
                # were given count as those callers coming back: others were
                # already waiting (read late, as a busy worker reads only
                # full batches).
                since = self.delivered_at_ms
                returned = sum(held.request.created_ms() >= since for held in inputs)
                if returned:
                    former.policy.arrived(returned, now)
            self.cond.notify_all()

    def pause(self, seconds: float, while_holding: bool = False) -> None:
        """Wait up to ``seconds`` for the model's thread to take what is in
        hand (``while_holding``: only while a batch waits and the model is
        free), or (otherwise) for the running batch to end."""
        with self.cond:
            waiting = (len(self.former) > 0 and not self.running) if while_holding else self.running
            if waiting:
                self.cond.wait(seconds)

    def reader_finished(self) -> None:
        with self.cond:
            self.reader_done = True
            self.cond.notify_all()

    # -- the model's side ------------------------------------------------------------

    def take(self, stopping: threading.Event) -> Tuple[Optional[List[Input]], bool]:
        """Wait until the batch read so far should run, by the in-process
        rule (full, or its oldest input waited ``max_latency``, or no caller
        just answered is still expected back), and take it, with whether it
        is a request run alone. ``(None, False)`` once the reader has stopped
        and nothing is left; ``([], False)`` when requests expired here and
        nothing is to run yet: the model's thread acknowledges them now, not
        when the next batch comes (which may be never)."""
        former = self.former
        with self.cond:
            while True:
                if len(former):
                    now = time.monotonic()
                    alone = former.alone_waiting()
                    fastest = former.policy.fastest(now)
                    self._late_ms = 0.0 if fastest is None else fastest * 1000
                    batch, hold_until = former.decide(now, go_now=stopping.is_set() or self.reader_done)
                    self._late_ms = 0.0
                    if batch:
                        self.running, self.running_size = True, len(batch)
                        self.cond.notify_all()  # the reader may fill the next one
                        return batch, alone
                    if self.expired:
                        # The reader may be waiting for the room these left.
                        self.cond.notify_all()
                        return [], False
                    self.cond.wait(None if hold_until == math.inf else hold_until - now)
                elif self.reader_done:
                    return None, False
                else:
                    self.cond.wait()

    def ran(self, answered: int, seconds: float, alone: bool, now_ms: float) -> None:
        """The batch taken has run (``seconds`` 0: not at all), answering
        ``answered`` callers, at ``now_ms`` by the server's clock."""
        with self.cond:
            self.running, self.running_size = False, 0
            if alone:
                self.orphan_in_hand = False
            if seconds:
                # Counted now, before the next batch is chosen: the callers
                # just answered come back within moments (their answers are
                # written next), and are worth waiting for.
                self.former.policy.delivered(answered, seconds, time.monotonic())
                self.delivered_at_ms = now_ms
            self.cond.notify_all()

    def learn(self, costs: List[float], out_of_memory: bool, ran: List[Tuple[int, int]]) -> None:
        with self.cond:
            self.former.learn(costs, out_of_memory, ran)


class Reader:
    """The reader thread of a worker (:meth:`run`): fills the next batch
    while the model runs, at most :meth:`read_ahead` requests beyond the
    running batch, or one request taken over from a dead worker, to run
    alone. ``sole_worker()`` says whether no other worker is alive (by the
    last heartbeat)."""

    def __init__(
        self,
        conn: Any,
        address: RedisAddress,
        keys: Keys,
        consumer: str,
        intake: Intake,
        handover: Handover,
        config: BatchingConfig,
        sole_worker: Callable[[], bool],
        refuse: Callable[[Input, BaseException], None],
        stopping: threading.Event,
    ) -> None:
        self._conn = conn
        self._address = address
        self._keys = keys
        self._consumer = consumer
        self._intake = intake
        self._handover = handover
        self._size = config.batch_size
        self._sole_worker = sole_worker
        self._refuse = refuse
        self._stopping = stopping

    def run(self) -> None:
        import redis

        intake, handover, former = self._intake, self._handover, self._handover.former
        stopping = self._stopping
        failing_since: Optional[float] = None
        errors = LoopErrors("the Redis worker's reader")
        try:
            while not stopping.is_set():
                with handover.cond:
                    jump = self._wait_for_room()
                    if stopping.is_set():
                        return
                    room, empty, busy = self.read_ahead() - len(former), not len(former), handover.running
                    now = time.monotonic()
                    hold_left = None if empty or busy else former.hold_until(now) - now
                try:
                    intake.ensure_group()
                    if jump is not None:
                        got = self._read_levels(jump)
                        if got:
                            handover.add(got)
                        continue
                    # Whatever this worker holds: with requests arriving
                    # all the time its read-ahead is never empty, and a dead
                    # worker's callers, who have already waited claim_after,
                    # would wait for the traffic to stop. One runs alone
                    # ahead of the batch held; the next is claimed once it ran.
                    if not handover.orphan_in_hand:
                        orphan = intake.claim_orphan(self._refuse)
                        if orphan is not None:
                            handover.add([orphan], alone=True)
                            continue
                    block = self._may_read(busy, room, hold_left)
                    if block is False:
                        continue
                    got = self._read(room, block)
                    if failing_since is not None:
                        logger.warning(
                            "%s: Redis is reachable again after %.1f s",
                            self._keys.namespace,
                            time.monotonic() - failing_since,
                        )
                        failing_since = None
                    if got:
                        handover.add(got)
                    elif block is None and not busy:  # holding: look again shortly, or once the batch is taken
                        handover.pause(_HOLD_POLL_S, while_holding=True)
                except broker_errors() as exc:
                    if failing_since is None:
                        failing_since = time.monotonic()
                        logger.warning(
                            "%s: lost Redis: %s; retrying", self._keys.namespace, broker_problem(exc, self._address)
                        )
                    intake.group_lost()
                    stopping.wait(min(MAX_BACKOFF_S, 0.05 + (time.monotonic() - failing_since) / 4))
                except redis.ResponseError as exc:
                    intake.group_lost()
                    if "NOGROUP" in str(exc):
                        logger.warning("the consumer group is gone (the Redis server restarted empty); recreating it")
                    elif is_wrong_type(exc):
                        for stream in intake.streams:
                            repair_key(self._conn, stream, "stream")
                    else:
                        errors.log(exc)
                        stopping.wait(0.1)
                except Exception as exc:  # never let the reader die: the worker would serve nothing
                    errors.log(exc)
                    stopping.wait(0.1)
        finally:
            handover.reader_finished()

    def _wait_for_room(self) -> Optional[List[int]]:
        """Wait (holding the handover's lock) until there is room to read
        ahead, or the reader stops; return ``None`` then. With priority
        levels, while the model is busy and the read-ahead holds lower
        levels' requests, look at the higher streams every few
        milliseconds: return how many of each level, the highest first,
        would go into the next batch ahead of what is held (see
        :meth:`_jump_room`)."""
        handover, former, stopping = self._handover, self._handover.former, self._stopping
        while not stopping.is_set():
            if not former.alone_waiting() and len(former) < self.read_ahead():
                return None
            jump = self._jump_room()
            if jump is not None:
                handover.cond.wait(self._poll_s())
                jump = self._jump_room()  # the model may have taken the batch meanwhile
                if jump is not None:
                    return jump
            else:
                handover.cond.wait()
        return None

    def _jump_room(self) -> Optional[List[int]]:
        """For a worker of several levels whose model is busy: how many
        requests of each level above the lowest held would go into the next
        batch ahead of those held (a level's count: the batch size less
        what is held at it and above), the highest first; ``None`` when
        none would, or while a request taken over waits to run alone."""
        leveled, handover = self._handover.leveled, self._handover
        if leveled is None or not handover.running or leveled.alone_waiting():
            return None
        held = leveled.levels_waiting()
        lowest = max((level for level, count in enumerate(held) if count), default=0)
        room, above = [], 0
        for level in range(lowest):
            above += held[level]
            room.append(max(0, self._size - above))
        return room if any(room) else None

    def _read(self, room: int, block: Any) -> List[Input]:
        """Read up to ``room`` requests (``block``: see :meth:`_may_read`),
        the highest level's first: each level's stream without blocking,
        for the room the levels above it left; where none had any and the
        read may block, every stream at once, until one has some."""
        streams = self._intake.streams
        if len(streams) == 1:
            reply = self._conn.xreadgroup(GROUP, self._consumer, {streams[0]: ">"}, count=room, block=block)
            return self._intake.accept(reply[0][1] if reply else [])
        got = self._read_levels([room] * len(streams))
        if got or block is None:
            return got
        reply = self._conn.xreadgroup(GROUP, self._consumer, dict.fromkeys(streams, ">"), count=room, block=block)
        levels = {stream.encode(): level for level, stream in enumerate(streams)}
        return [held for stream, entries in reply or [] for held in self._intake.accept(entries, levels[stream])]

    def _read_levels(self, rooms: List[int]) -> List[Input]:
        """Read, without blocking, up to ``rooms[level]`` requests of each
        level's stream, the highest first, less what the levels above
        gave: one round trip per level read."""
        got: List[Input] = []
        taken = 0
        for level, room in enumerate(rooms):
            count = room - taken
            if count <= 0:
                continue
            reply = self._conn.xreadgroup(GROUP, self._consumer, {self._intake.streams[level]: ">"}, count=count)
            entries = reply[0][1] if reply else []
            taken += len(entries)
            got += self._intake.accept(entries, level)
        return got

    def read_ahead(self) -> int:
        """How many requests to hold besides the running batch: a full batch;
        for the only worker alive shaping by cost, what two full batches
        would be, less the running one. Its shaped batches are usually far
        smaller than ``batch_size``, and the more it holds the more alike
        the inputs it can put together; no other worker waits for them. A
        SIGKILL still loses nothing: all of it is pending under its name."""
        if self._handover.former.shaped and self._sole_worker():
            return 2 * self._size - self._handover.running_size
        return self._size

    def _may_read(self, busy: bool, room: int, hold_left: Optional[float]) -> Any:
        """Whether to read now, and how: ``False``, not now (having waited a
        little); ``None``, without blocking; else how long to block, ms.

        Where several workers serve a prefix they read as in-process workers
        are handed batches, so that callers reach a free worker:

        - a busy worker (its model runs) reads ahead only a full batch;
        - a free worker with nothing in hand waits for requests (a blocking
          read: whatever comes is its own);
        - a free worker holding a partial batch for companions looks for them
          without blocking, each millisecond, until its model takes the
          batch. A blocking read could outlive that moment (Redis ends short
          blocks only on its own timer, 100 ms apart by default), and would
          take the next caller for a busy worker from a free one.

        The only worker alive reads whatever comes, whenever."""
        if self._sole_worker():
            return _BLOCK_MS
        if busy:
            if self._backlog() >= room:
                return None
            self._handover.pause(self._poll_s())
            return False
        if hold_left is None:
            return _BLOCK_MS
        if hold_left > 0:
            return None
        self._handover.pause(_HOLD_POLL_S, while_holding=True)  # the batch goes now: let the model take it first
        return False

    def _backlog(self) -> int:
        """Requests in the stream that no worker has taken yet, about: the
        entries, less those delivered and not yet acknowledged (each answered
        request is deleted when acknowledged)."""
        pipe = self._conn.pipeline(transaction=False)
        for stream in self._intake.streams:
            pipe.xlen(stream)
            pipe.xpending(stream, GROUP)
        replies = pipe.execute()
        return sum(
            int(length) - int(pending.get("pending") or 0) for length, pending in zip(replies[::2], replies[1::2])
        )

    def _poll_s(self) -> float:
        """How often a busy worker looks for a full batch waiting: an eighth
        of a batch's time, within 1 to 10 ms."""
        service = self._handover.former.policy.service
        return 0.002 if service is None else min(0.01, max(0.001, service / 8))
