"""The web side of the Redis backend at work: :class:`RedisClientBackend`
queues a :class:`~.streamer.RedisStreamer`'s inputs on the requests
stream and reads the answers from a results stream of its own.

This module holds the backend as the scheduler sees it: batches handed
over, how much may be out in Redis, the workers as the stats and probes
ask. How requests are put in Redis is :mod:`.sender`'s, how answers are
read back :mod:`.collector`'s (the collector thread), what was sent and
waits :mod:`.ledger`'s, the workers as seen from here :mod:`.roster`'s."""

from __future__ import annotations

import functools
import logging
import threading
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

from ...batching.calls import Item, live_items
from ...batching.scheduler import Scheduler
from ...codec import Buffers, get_codec
from ...errors import BrokerUnavailableError, SerializationError
from ...options.config import OPTIONS
from ...options.redis_address import RedisAddress
from ...streamer import Backend, item_cost_of
from ...threads import background
from .collector import BLOCK_MS, ResultCollector
from .connection import (
    ServerIdentity,
    broker_errors,
    broker_problem,
    connect,
    refuses_setup,
    setup_refused,
)
from .damage import DeadLetters
from .ledger import Ledger
from .roster import Roster
from .sender import SEND_RETRY_S as SEND_RETRY_S  # the sender's, named here too (run() gives up by it)
from .sender import RequestSender
from .wire import Keys, new_client_id

__all__ = ["RedisClientBackend"]

logger = logging.getLogger("streamer_core.redis")

#: A large call's inputs out in Redis at a time: this many of each live worker's batches (one
#: running, the next behind it); the rest waits here, later calls' inputs going ahead of it.
BATCHES_PER_WORKER = 2


class RedisClientBackend(Backend):
    name = "redis"
    copies_inputs = True
    sheds_late = False  # batches here are sends to Redis

    def __init__(
        self,
        address: RedisAddress,
        prefix: str,
        codec: str,
        require_workers: bool = False,
        item_cost: Optional[Callable[[Any], float]] = None,
        levels: int = 1,
        hold_back: bool = False,
    ) -> None:
        self._item_cost = item_cost
        #: Whether what its workers cannot take waits here (see _room), for the overload rule.
        self._hold_back = hold_back
        self._codec = get_codec(codec)
        self._keys = Keys(prefix, address.is_cluster)
        #: The workers as this process sees them (checked every _CHECK_SERVER_S).
        self.roster = Roster(self._keys, require_workers, levels)
        self._dead = DeadLetters(self._keys)
        client_id = new_client_id()
        self._results_key = self._keys.results(client_id)
        self._address = address
        self._send_conn = connect(address)
        self._read_conn = connect(address)
        self._ask_conn = connect(address, asking=True)  # a scrape's questions: a frozen Redis said in a second
        #: What was sent and waits for its answer.
        self.ledger = Ledger(levels)
        self._stopping = threading.Event()
        self._server = ServerIdentity()
        self._sender = RequestSender(self._send_conn, address, self._keys, self._codec, client_id, self.ledger)
        self._results = ResultCollector(
            self._read_conn,
            address,
            self._keys,
            self._results_key,
            (self._codec, get_codec("msgpack")),
            self.roster,
            self.ledger,
            self._dead,
            self._server,
            self._sender.send,
            self._stopping,
        )
        self._scheduler: Optional[Scheduler] = None
        self._collector = background(self._results.run, "streamer-redis-collect")
        self._deleter = background(
            functools.partial(self._sender.delete_abandoned, self._stopping), "streamer-redis-delete"
        )

    def start(self, scheduler: Scheduler) -> None:
        self._scheduler = self._results.scheduler = scheduler
        try:
            self._server.changed(self._send_conn, self._keys.requests)  # the first: nothing to send again
            if self.roster.watching:
                self.roster.check(self._read_conn)  # now, so that the first calls are judged as the later ones
            else:
                self.roster.live_batch_sizes(self._read_conn)  # how much of a large call is out at once
        except Exception as exc:
            if refuses_setup(exc):  # e.g. "DB index is out of range", a wrong password: a setting to fix
                self._close_connections()
                raise setup_refused(self._address, exc) from exc
            if not isinstance(exc, broker_errors()):
                raise
            logger.warning("%s; calls fail until it answers", broker_problem(exc, self._address))
        scheduler.add_slot()
        scheduler.gate_parked(self._out_limit)
        if self._hold_back:
            scheduler.hold_back(self._room)
        if scheduler.stats is not None:
            self._dead.stats = scheduler.stats
            scheduler.stats.watch_broker(self)
        self._collector.start()
        self._deleter.start()

    def encode(self, value: Any, index: int) -> Tuple[bytes, Buffers, Optional[float]]:
        """The input's payload, buffers and cost (by ``item_cost``, which
        travels with the request for the workers to shape batches by)."""
        cost = item_cost_of(self._item_cost, value, index) if self._item_cost is not None else None
        try:
            payload, buffers = self._codec.dumps(value)
        except SerializationError as exc:
            raise SerializationError(f"input {index}: {exc}") from exc
        return payload, buffers, cost

    # sending

    def run(self, items: List[Item], held: int) -> None:
        scheduler = self._scheduler
        assert scheduler is not None
        sent = self.ledger.add(live_items(items, scheduler.stats))  # those given up meanwhile counted, not sent
        try:
            # Each call is refused within SEND_RETRY_S of its arrival, however
            # long sends before it retried (they went one after another).
            give_up_at = min(item.arrival for _, item in sent) + SEND_RETRY_S if sent else 0.0
            failure = self._sender.send(sent, give_up_at) if sent else None
        except BaseException:  # the dispatcher fails the batch and frees the slot
            self.ledger.unsent(sent)
            raise
        # The items are Redis's now: this side only waits for their answers.
        scheduler.batch_done(0, 0.0, held)
        if failure is not None:
            error = BrokerUnavailableError(
                f"{broker_problem(failure, self._address)}: the call was not queued; retry later"
            )
            self.ledger.unsent(sent)
            # Not under the lock: a call whose other inputs went in an earlier
            # send withdraws them as it fails (_calls_ended takes the lock).
            for _, item in sent:
                item.task.fail(error)
            return
        for request_id, item in sent:
            future = item.task.future
            if future is None:
                continue
            # Told when the call ends unanswered (not a done-callback: that
            # would cost every call the future's slow path).
            hook = future._unanswered
            if hook is None:
                future._unanswered = functools.partial(self.ledger.ended, [request_id])
            else:  # another input of the same call
                hook.args[0].append(request_id)  # type: ignore[attr-defined]
            if future.done():  # it ended before the hook was in place, or as it was added
                self.ledger.ended([request_id])

    def _out_limit(self) -> int:
        """How many of a large call's inputs may be out at once (under the scheduler's lock: no I/O)."""
        return BATCHES_PER_WORKER * (sum(self.roster.batch_sizes) or OPTIONS["batch_size"].default)

    def _room(self, level: int) -> int:
        """How many more inputs this process may send now, ``level`` the
        priority level served next: what its workers take in
        :data:`BATCHES_PER_WORKER` batches each, less those out unanswered
        at that level and higher ones (a worker reads a higher level's
        stream first, so what a lower level has out does not hold it back).
        The rest waits here, where an overload is seen and served newest
        first (:mod:`streamer_core.batching.overload`), not in the stream, which
        workers read oldest first. Under the scheduler's lock (the ledger's
        is a leaf: never held while the scheduler's is taken)."""
        return self._out_limit() - self.ledger.unanswered_up_to(level)

    def live_workers(self, conn: Any = None) -> int:
        """How many workers serve this prefix now (beat within the last
        ``PRESENCE_MS``), by asking Redis."""
        return self.roster.live(conn or self._send_conn)

    def missing_workers(self) -> bool:
        """Whether calls are to be refused for want of workers (see :meth:`Roster.missing_now`)."""
        return self.roster.missing_now(self._send_conn)

    def why_not_ready(self) -> Optional[str]:
        """Why no call can be served now (see :meth:`Roster.why_not_ready`)."""
        return self.roster.why_not_ready(self._send_conn)

    def workers_now(self) -> int:
        return 0  # none of this process's: Redis's are asked at each read (live_workers_by_device)

    def waiting(self) -> int:
        return self.unanswered()

    def waiting_by_level(self, levels: int) -> List[int]:
        return self.ledger.by_level()

    def wait_ready(self, timeout: float) -> bool:
        """Wait until a worker serves this prefix; whether one did in time."""
        return self.roster.wait_live(self._send_conn, timeout)

    # closing

    def stop(self, deadline: float) -> None:
        if self._scheduler is not None and self._scheduler.stats is not None:
            self._scheduler.stats.unwatch_broker(self)
        self._stopping.set()
        self.ledger.abandon.set()
        if threading.current_thread() is not self._collector:
            self._collector.join(max(0.0, deadline - time.monotonic()) + BLOCK_MS / 1000 + 1.0)
            self._deleter.join(1.0)
        try:
            self._read_conn.delete(self._results_key)
        except broker_errors():
            pass
        self._close_connections()

    def _close_connections(self) -> None:
        for conn in (self._send_conn, self._read_conn, self._ask_conn):
            conn.close()

    def pending_requests(self) -> int:
        return self.roster.pending(self._ask_conn)  # streamer_redis_pending: see Roster.pending

    def live_workers_by_device(self) -> Dict[str, int]:
        return self.roster.live_by_device(self._ask_conn)  # streamer_workers_live: see ModelStats.broker_workers

    def unanswered(self) -> int:
        """Inputs sent and not answered yet, of calls still running."""
        return self.ledger.unanswered()
