"""Requests coming into a Redis worker: parsed, decoded, costed and held.

An entry of the requests stream becomes an :class:`Input` here
(:meth:`Intake.accept`): its input decoded by the worker's codec and costed,
or the error its caller gets instead (an entry that does not parse goes to
the dead-letter stream; one whose caller has given up is acknowledged and
deleted unrun). Requests of workers that died are taken over one at a time
(:meth:`Intake.claim_orphan`), the highest priority level's first. With
priority levels every level has a stream of its own
(:meth:`~.wire.Keys.request_stream`), and each request knows the level of
the stream it came from (:attr:`~.wire.Request.level`): it is acknowledged,
deleted, claimed and dead-lettered there. What a worker accepts is in its
:class:`Hands` until answered: the heartbeat (:mod:`.presence`) keeps those
requests claimed, the writer (:mod:`.answers`) lets them go. Deadlines are
read by the Redis server's clock (:class:`ServerClock`), whatever the
machines' clocks say.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, Callable, Dict, Iterable, List, Optional, Tuple

from ...codec import Codec
from ...errors import ItemCostError, SerializationError, WorkerDiedError
from ...streamer import item_cost_of
from ...telemetry.stats import ModelStats
from .connection import server_time_ms
from .damage import DeadLetters
from .wire import GROUP, WIRE_VERSION, Keys, MalformedEntry, Request, by_level, parse_request

__all__ = ["Input", "Hands", "ServerClock", "Intake"]

logger = logging.getLogger("streamer_core.redis")

#: Seconds between two sweeps of the consumers of dead workers, and how long
#: one must have been idle (at least; 30 times ``claim_after`` if longer) to go.
SWEEP_EVERY_S = 60.0
SWEEP_IDLE_S = 60.0
#: A worker taking over a dead one's requests names the first, then says how
#: many more it took at most this often (seconds) and once none are left: a
#: worker that died holding a thousand requests is not a thousand log lines.
TAKEOVER_SAID_EVERY_S = 10.0


class Input:
    """A request in this worker's hands: its input, decoded by the reader,
    or the error that answers it without running the model."""

    __slots__ = ("request", "value", "error", "cost", "arrival", "level")

    def __init__(
        self, request: Request, value: Any = None, error: Optional[BaseException] = None, cost: float = 1.0
    ) -> None:
        self.request = request
        self.value = value
        self.error = error
        self.cost = cost
        self.arrival = time.monotonic()  # when this worker read it
        self.level = request.level  # its priority level, 0 the highest (streamer_core.batching.levels)


class Hands:
    """The requests a worker holds (read ahead, running, being answered),
    by priority level and stream entry id: the heartbeat keeps them
    claimed, so no other worker takes them over while this one lives."""

    def __init__(self) -> None:
        self._ids: Dict[Tuple[int, bytes], None] = {}
        self._lock = threading.Lock()

    def hold(self, requests: Iterable[Request]) -> None:
        with self._lock:
            for request in requests:
                self._ids[request.level, request.entry_id] = None

    def release(self, requests: Iterable[Request]) -> None:
        with self._lock:
            for request in requests:
                self._ids.pop((request.level, request.entry_id), None)

    def ids(self) -> Dict[int, List[bytes]]:
        """The entry ids held, by level."""
        with self._lock:
            held = list(self._ids)
        return by_level((level, entry_id) for level, entry_id in held)


class ServerClock:
    """The Redis server's clock in milliseconds (entry ids are its time),
    from an offset refreshed now and then over ``conn``, so the clocks of
    other machines do not matter."""

    def __init__(self, conn: Any, key: str = "") -> None:
        self._conn = conn
        self._key = key  # on a Cluster, the clock of the node holding it
        self._offset_ms = 0.0
        self._checked = float("-inf")

    def now_ms(self, refresh: bool = True) -> float:
        """The server's time now; ``refresh`` (from the thread that owns
        ``conn`` only) asks the server again when the offset is 30 s old."""
        now = time.monotonic()
        if refresh and now - self._checked > 30.0:
            self._offset_ms = server_time_ms(self._conn, self._key) - now * 1000
            self._checked = now
        return now * 1000 + self._offset_ms


class Intake:
    """The reader thread's dealings with the requests stream, for the
    consumer ``consumer`` of the workers' group, over the reader's ``conn``."""

    def __init__(
        self,
        conn: Any,
        consumer: str,
        keys: Keys,
        codec: Codec,
        item_cost: Optional[Callable[[Any], float]],
        hands: Hands,
        clock: ServerClock,
        claim_after: float,
        max_item_crashes: int,
        stats: Optional[ModelStats] = None,
        levels: int = 1,
    ) -> None:
        self._conn = conn
        self._consumer = consumer
        self._keys = keys
        self._stats = stats  # counts what is taken over and what is dead-lettered
        self._dead = DeadLetters(keys, stats=stats)
        self._codec = codec
        self._item_cost = item_cost
        self._hands = hands
        self._clock = clock
        self._claim_after = claim_after
        self._max_item_crashes = max_item_crashes
        self._group_ready = False
        self._next_claim = 0.0
        self._next_sweep = 0.0
        self._taken_unsaid: List[bytes] = []  # taken over since the last line saying so
        self._next_said = 0.0
        #: The requests streams read, one per priority level, the highest first.
        self.streams = keys.request_streams(levels)

    def ensure_group(self) -> None:
        """Create the workers' consumer group (and the stream) of every
        level unless it is known to be there."""
        if self._group_ready:
            return
        import redis

        for stream in self.streams:
            try:
                self._conn.xgroup_create(stream, GROUP, id="0", mkstream=True)
            except redis.ResponseError as exc:
                if "BUSYGROUP" not in str(exc):
                    raise
        self._group_ready = True

    def group_lost(self) -> None:
        """Redis failed or answered oddly: make sure of the group next time."""
        self._group_ready = False

    def accept(self, entries: List[Tuple[Any, Any]], level: int = 0) -> List[Input]:
        """The requests worth running of those read from the stream of
        priority ``level``, decoded and held. Entries that do not parse go
        to the dead-letter stream; those of callers that have given up are
        acknowledged and deleted unrun."""
        accepted: List[Input] = []
        drop: List[bytes] = []
        stream = self.streams[level]
        pipe = self._conn.pipeline(transaction=False)
        server_now_ms = self._clock.now_ms()
        for entry_id, fields in entries:
            try:
                request = parse_request(entry_id, fields, level)
            except MalformedEntry as exc:
                self._dead.add(pipe, stream, entry_id, fields, str(exc))
                if isinstance(entry_id, bytes):
                    drop.append(entry_id)
                continue
            if server_now_ms > request.created_ms() + request.timeout_ms:
                drop.append(entry_id)  # its caller has given up
                if self._stats is not None:
                    self._stats.dropped("expired")
                continue
            accepted.append(self.decode(request))
        if drop:
            pipe.xack(stream, GROUP, *drop)
            pipe.xdel(stream, *drop)
        if len(pipe):
            pipe.execute(raise_on_error=False)
        self._hands.hold(held.request for held in accepted)
        return accepted

    def decode(self, request: Request) -> Input:
        """The request's input, or the error its caller gets instead."""
        if request.version > WIRE_VERSION:
            return Input(request, error=SerializationError(
                f"the request was written by a newer version of streamer_core (wire format {request.version}; "
                f"this worker reads up to {WIRE_VERSION}): upgrade the workers"
            ))  # fmt: skip
        if request.codec != self._codec.name:
            logger.warning(
                "refused a %r payload from client %s: this worker reads only %r (start it with codec=%r "
                "to accept it, if the broker is trusted)",
                request.codec, request.client, self._codec.name, request.codec,
            )  # fmt: skip
            error = SerializationError(f"the worker refuses {request.codec!r} payloads; it reads {self._codec.name!r}")
            return Input(request, error=error)
        try:
            value = self._codec.loads(request.payload, request.buffers)
        except Exception as exc:
            logger.warning("rejected a payload from client %s: %s", request.client, exc)
            return Input(request, error=SerializationError(f"the worker could not read this input: {exc}"))
        cost = request.cost
        if cost is None and self._item_cost is not None:
            try:
                cost = item_cost_of(self._item_cost, value)
            except ItemCostError as exc:
                return Input(request, error=exc)
        return Input(request, value, cost=1.0 if cost is None else cost)

    def claim_orphan(self, refuse: Callable[[Input, BaseException], None]) -> Optional[Input]:
        """Take over one request whose worker stopped its heartbeat (it died),
        to run it alone. One at a time, each run before the next is taken:
        a request's delivery count then counts the workers that died while
        they held it, and nothing taken over waits without a heartbeat. One
        that has been in ``max_item_crashes`` dead workers' hands is not run:
        ``refuse`` answers it with :class:`WorkerDiedError`. Each request
        taken over counts as redelivered, whether it runs or not. With
        priority levels, the highest level's are taken over first."""
        now = time.monotonic()
        if now < self._next_claim:
            return None
        if now >= self._next_sweep:
            self._next_sweep = now + SWEEP_EVERY_S
            self._sweep_consumers()
        level = 0
        while level < len(self.streams):
            stream = self.streams[level]
            reply = self._conn.xautoclaim(stream, GROUP, self._consumer, int(self._claim_after * 1000), "0-0", count=1)
            claimed, deleted = reply[1], (reply[2] if len(reply) > 2 else [])
            if deleted:
                self._conn.xack(stream, GROUP, *deleted)
            claimed = [entry for entry in claimed if entry[0] is not None and entry[1]]
            if not claimed:
                level += 1  # none left at this level: the next one
                continue
            if self._stats is not None:
                self._stats.redelivered(len(claimed))
            entry_id = claimed[0][0]
            [pending] = self._conn.xpending_range(stream, GROUP, entry_id, entry_id, 1) or [{}]
            crashes = pending.get("times_delivered", 1) - 1
            accepted = self.accept(claimed, level)
            if not accepted:
                continue  # expired or malformed, and acked away
            held = accepted[0]
            self._taken_unsaid.append(entry_id)
            if time.monotonic() >= self._next_said:
                self._say_taken()
            if crashes < self._max_item_crashes:
                self._next_claim = time.monotonic()  # there may be more: take the next one after it
                return held
            refuse(
                held,
                WorkerDiedError(
                    f"this input was in the hands of {crashes} workers that died, so it is not retried "
                    "(it may be what kills them)"
                ),
            )
        self._next_claim = now + self._claim_after / 2  # none left: look again later
        if self._taken_unsaid:
            self._say_taken()
        return None

    def _say_taken(self) -> None:
        """Log the requests taken over since the last such line: the one by
        its id, more by their count and the last one's id."""
        taken, self._taken_unsaid = self._taken_unsaid, []
        self._next_said = time.monotonic() + TAKEOVER_SAID_EVERY_S
        if len(taken) == 1:
            logger.warning("took over request %s from a worker that stopped answering", taken[0].decode())
        else:
            logger.warning(
                "took over %d more requests from workers that stopped answering (the last %s)",
                len(taken),
                taken[-1].decode(),
            )

    def _sweep_consumers(self) -> None:
        """Remove consumers of dead workers: they hold nothing (their requests
        were taken over) and have not been seen for a long while."""
        idle_ms = int(max(SWEEP_IDLE_S, 30 * self._claim_after) * 1000)
        me = self._consumer.encode()
        for stream in self.streams:
            for consumer in self._conn.xinfo_consumers(stream, GROUP):
                name = consumer.get("name")
                if isinstance(name, str):
                    name = name.encode()
                if name != me and consumer.get("pending") == 0 and (consumer.get("idle") or 0) > idle_ms:
                    self._conn.xgroup_delconsumer(stream, GROUP, name)
