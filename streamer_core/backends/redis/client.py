"""The web side of the Redis backend at work: :class:`RedisClientBackend`
queues a :class:`~.streamer.RedisStreamer`'s inputs on the requests
stream and reads the answers from a results stream of its own."""

from __future__ import annotations

import functools
import logging
import threading
import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, cast

from streamer_core.batching.scheduler import Scheduler, _Item, deliver, live_items
from streamer_core.options.config import OPTIONS
from streamer_core.options.redis_address import RedisAddress
from streamer_core.telemetry.tracing import to_traceparent

from ...codec import Buffers, get_codec
from ...errors import BrokerUnavailableError, SerializationError
from ...streamer import Backend, item_cost_of
from ...threads import background
from .answers import read_answer
from .connection import (
    MAX_BACKOFF_S,
    LoopErrors,
    OutageLog,
    ServerIdentity,
    broker_errors,
    broker_problem,
    connect,
    refuses_setup,
    setup_refused,
)
from .damage import DeadLetters, is_wrong_type, repair_key
from .ledger import Ledger
from .roster import NO_WORKER_S, Roster
from .wire import (
    ADD_PACKED_REQUESTS_SCRIPT,
    ADD_REQUESTS_SCRIPT,
    RESULTS_TTL_S,
    Keys,
    MalformedEntry,
    Result,
    by_level,
    new_client_id,
    next_id,
    packed_request_arguments,
    parse_results,
    request_arguments,
    request_fields,
)

__all__ = ["RedisClientBackend"]

logger = logging.getLogger("streamer_core.redis")

# The longest a web process holds a worker's batch of answers while the
# callers of the batch it answered just before come back (seconds): see
# _let_callers_return. Long enough for 64 callers on a busy 2-core machine.
_STAGGER_S = 0.003
#: How long a web process tries to send a call to Redis, from the call's
#: arrival, before it fails with BrokerUnavailableError (seconds). The last
#: try may take longer: a connection to a host that does not answer is given
#: up after connect()'s socket_connect_timeout.
SEND_RETRY_S = 1.5
# The first pause between two tries of a send; each next one is twice as long.
_FIRST_RETRY_S = 0.1
# How often a web process checks the server is the same one (a restart empties it), counts workers.
_CHECK_SERVER_S = 1.0
#: A large call's inputs out in Redis at a time: this many of each live worker's batches (one
#: running, the next behind it); the rest waits here, later calls' inputs going ahead of it.
BATCHES_PER_WORKER = 2
_BLOCK_MS = 500
#: A request to send: request id, timeout in ms, payload, buffers, cost, traceparent.
_Request = Tuple[bytes, int, bytes, Buffers, Optional[float], Optional[str]]


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
        self._errors_codec = get_codec("msgpack")
        self._keys = Keys(prefix, address.is_cluster)
        #: The workers as this process sees them (checked every _CHECK_SERVER_S).
        self.roster = Roster(self._keys, require_workers, levels)
        self._dead = DeadLetters(self._keys)
        self._client_id = new_client_id()
        self._results_key = self._keys.results(self._client_id)
        self._address = address
        self._send_conn = connect(address)
        self._read_conn = connect(address)
        self._ask_conn = connect(address, asking=True)  # a scrape's questions: a frozen Redis said in a second
        self._add_requests = self._send_conn.register_script(ADD_REQUESTS_SCRIPT)
        self._add_packed = self._send_conn.register_script(ADD_PACKED_REQUESTS_SCRIPT)
        self._packed = True  # until the server's Lua turns out to lack cmsgpack
        #: What was sent and waits for its answer.
        self.ledger = Ledger(levels)
        self._stopping = threading.Event()
        self._server = ServerIdentity()
        namespace = self._keys.namespace
        self._send_outage = OutageLog(f"{namespace}: could not send to Redis", f"{namespace}: sending to Redis again")
        self._scheduler: Optional[Scheduler] = None
        self._collector = background(self._collect, "streamer-redis-collect")
        self._deleter = background(self._delete_abandoned, "streamer-redis-delete")

    def start(self, scheduler: Scheduler) -> None:
        self._scheduler = scheduler
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

    def run(self, items: List[_Item], held: int) -> None:
        scheduler = self._scheduler
        assert scheduler is not None
        sent = self.ledger.add(live_items(items, scheduler.stats))  # those given up meanwhile counted, not sent
        try:
            # Each call is refused within SEND_RETRY_S of its arrival, however
            # long sends before it retried (they went one after another).
            give_up_at = min(item.arrival for _, item in sent) + SEND_RETRY_S if sent else 0.0
            failure = self._send(sent, give_up_at) if sent else None
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

    def _delete_abandoned(self) -> None:
        """Delete the requests of calls that ended other than by their
        answers (the caller gave up, a timeout, an error; see
        :meth:`Ledger.ended`), as soon as they end, so that a worker that has
        not read them never runs them (a thread of its own: the caller
        giving up must not wait on Redis)."""
        errors = LoopErrors("the Redis request deleter")
        abandon = self.ledger.abandon
        while not self._stopping.is_set():
            abandon.wait(0.5)
            abandon.clear()
            abandoned = self.ledger.take_abandoned()
            if abandoned:
                try:
                    pipe = self._send_conn.pipeline(transaction=False)
                    for level, entry_ids in by_level(abandoned).items():
                        pipe.xdel(self._keys.request_stream(level), *entry_ids)
                    pipe.execute()
                except broker_errors():
                    pass  # gone with Redis, or workers skip them when their deadline passes
                except Exception as exc:  # e.g. the key holds another type: workers skip them too
                    errors.log(exc)

    def _send(self, entries: Sequence[Tuple[bytes, _Item]], give_up_at: float) -> Optional[BaseException]:
        """XADD the entries, retrying through a blip (a lost connection, or
        Redis refusing writes: out of memory, a read-only replica) with a
        doubling pause, the last try at ``give_up_at`` (a ``time.monotonic()``
        value); ``None`` once sent, else the last error."""
        import redis

        failure: Optional[BaseException] = None
        pause = _FIRST_RETRY_S
        levels = sorted({item.level for _, item in entries})  # the highest first: each level to its stream
        while True:
            try:
                now = time.monotonic()
                while levels:
                    level = levels[0]
                    sent, requests, large = [], [], False
                    for request_id, item in entries:
                        future = item.task.future
                        if future is None or item.level != level:
                            continue
                        payload, buffers, cost = item.value
                        trace = None if item.task.trace is None else to_traceparent(item.task.trace)  # traced only
                        timeout_ms = max(1, int((future._deadline - now) * 1000))
                        requests.append((request_id, timeout_ms, payload, buffers, cost, trace))
                        sent.append(request_id)
                        large = large or bool(buffers)
                    self.ledger.added(sent, self._add(requests, large, level) if requests else [])
                    levels.pop(0)
                self._send_outage.succeeded()
                return None
            except broker_errors() as exc:
                failure = exc
                self._send_outage.failed(broker_problem(exc, self._address))
            except redis.ResponseError as exc:
                failure = exc
                if is_wrong_type(exc):
                    repair_key(self._send_conn, self._keys.request_stream(levels[0]), "stream")
                else:
                    self._send_outage.failed(broker_problem(exc, self._address))
            left = give_up_at - time.monotonic()
            if left <= 0:
                return failure
            time.sleep(min(pause, left))
            pause *= 2

    def _add(self, requests: Sequence[_Request], large: bool, level: int = 0) -> List[Any]:
        """Add one request entry each to the stream of priority ``level``,
        in one round trip; return their entry ids. ``requests``: request
        id, timeout in ms, payload, buffers, cost, traceparent."""
        import redis

        keys = [self._keys.request_stream(level)]
        if not large and self._packed:
            packed = [
                (request_id, timeout, payload, cost, trace) for request_id, timeout, payload, _, cost, trace in requests
            ]
            try:
                return cast(
                    List[Any],
                    self._add_packed(
                        keys, packed_request_arguments(self._client_id, self._codec.name, packed), self._send_conn
                    ),
                )
            except redis.ResponseError as exc:
                if "cmsgpack" not in str(exc):
                    raise
                logger.info("this Redis server's Lua has no cmsgpack: requests go in plain arguments")
                self._packed = False
        added = [
            request_fields(self._client_id, request_id, timeout_ms, self._codec.name, payload, buffers, cost, trace)
            for request_id, timeout_ms, payload, buffers, cost, trace in requests
        ]
        if large:
            # Arrays' bytes go to the socket as they are (see connection.py);
            # in a script Redis would copy them twice.
            pipe = self._send_conn.pipeline(transaction=False)
            for fields in added:
                pipe.xadd(keys[0], fields)
            return cast(List[Any], pipe.execute())
        return cast(List[Any], self._add_requests(keys, request_arguments(added), self._send_conn))

    # receiving

    def _collect(self) -> None:
        """Read answers as they come and hand them to their calls. The
        trimming of what was read (and any dead letters) rides in the same
        round trip as the next read, so answers wait on nothing else."""
        import redis

        last_id = b"0-0"
        next_check = 0.0
        failing_since: Optional[float] = None
        errors = LoopErrors("the Redis result collector")
        pipe = self._read_conn.pipeline(transaction=False)
        while not self._stopping.is_set():
            try:
                now = time.monotonic()
                if now >= next_check:
                    next_check = now + _CHECK_SERVER_S
                    if self._server_restarted():
                        last_id = b"0-0"
                    pipe.expire(self._results_key, RESULTS_TTL_S)
                    if self.roster.watching:
                        self.roster.check(self._read_conn)  # the workers' batch sizes too
                        if self.roster.missing():
                            self._fail_waiting(self.roster.error)
                    else:
                        self.roster.live_batch_sizes(self._read_conn)
                pipe.xread({self._results_key: last_id}, count=1000, block=_BLOCK_MS)
                replies = pipe.execute(raise_on_error=False)
                reply = replies[-1]
                if isinstance(reply, Exception):
                    raise reply
                if failing_since is not None:
                    away_s, failing_since = time.monotonic() - failing_since, None
                    logger.warning("%s: Redis is reachable again after %.1f s", self._keys.namespace, away_s)
                if reply:
                    entries = reply[0][1]
                    last_id = entries[-1][0]
                    self._on_results(entries, pipe)
                    pipe.xtrim(self._results_key, minid=next_id(last_id))  # everything read, that one too
            except broker_errors() as exc:
                pipe.reset()
                self.roster.unreachable()
                if failing_since is None:
                    failing_since = time.monotonic()
                    problem = broker_problem(exc, self._address)
                    logger.warning("%s: lost Redis: %s; reconnecting", self._keys.namespace, problem)
                next_check = 0.0
                self._stopping.wait(min(MAX_BACKOFF_S, 0.05 + (time.monotonic() - failing_since) / 4))
            except redis.ResponseError as exc:
                pipe.reset()
                if is_wrong_type(exc) and repair_key(self._read_conn, self._results_key, "stream"):
                    # What it held instead of our stream replaced any answers in it.
                    last_id = b"0-0"
                    self._send_again("its results stream was overwritten")
                    continue
                errors.log(exc)
                self._stopping.wait(0.1)
            except Exception as exc:
                pipe.reset()
                errors.log(exc)
                self._stopping.wait(0.1)

    def _on_results(self, entries: List[Tuple[Any, Any]], pipe: Any) -> None:
        """Hand each answer to its call; drop answers of calls no longer
        waiting; queue on ``pipe`` the move of entries that are not answers
        to the dead-letter stream. Each entry answers one batch of a worker."""
        batches: List[Tuple[List[_Item], List[Result]]] = []
        ledger = self.ledger
        with ledger.lock:
            for entry_id, fields in entries:
                try:
                    parsed = parse_results(fields)
                except MalformedEntry as exc:
                    self._dead.add(pipe, self._results_key, entry_id, fields, str(exc))
                    continue
                items, answers = [], []
                for answer, item in zip(parsed, ledger.answered([answer.item_id for answer in parsed])):
                    if item is not None:  # else answered already (sent twice after a restart) or given up
                        items.append(item)
                        answers.append(answer)
                if items:
                    batches.append((items, answers))
        scheduler = self._scheduler
        for items, answers in batches:
            outcomes = [read_answer(answer, self._codec, self._errors_codec) for answer in answers]
            if scheduler is not None:
                self._let_callers_return(scheduler)
                scheduler.answered(len(items), time.monotonic() - min(item.arrival for item in items))
            deliver(items, outcomes)
        if batches and scheduler is not None:
            scheduler.wake_parked()

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

    def _let_callers_return(self, scheduler: Scheduler) -> None:
        """Before answering a batch, let the callers of the one answered
        just before it come back, for at most _STAGGER_S. Two workers that
        finish together would otherwise have their callers come back
        together, sent together, start together and finish together again,
        every time, each batch's round trip twice as long."""
        until = time.monotonic() + _STAGGER_S
        while True:
            now = time.monotonic()
            if now >= until or not scheduler.callers_returning(now):
                return
            time.sleep(0.0002)

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

    def _fail_waiting(self, make_error: Callable[[], BaseException]) -> None:
        """Fail every call waiting for an answer. Their requests are deleted
        as each call ends (see :meth:`_calls_ended`), so a worker that starts
        later does not run them for nobody."""
        waiting = [item for _, item in self.ledger.waiting()]
        if waiting:
            logger.warning("no worker has been alive for %gs: failing %d waiting calls", NO_WORKER_S, len(waiting))
        for item in waiting:
            item.task.fail(make_error())

    def _server_restarted(self) -> bool:
        """Whether the server is not the one the pending items were sent to; if
        so, send them again (a restarted server has lost them)."""
        if not self._server.changed(self._read_conn, self._keys.requests):
            return False
        self._send_again("another Redis server answers now (a restart, or a failover to a replica)")
        return True

    def _send_again(self, reason: str) -> None:
        """Send every unanswered request again: Redis lost them, or their
        answers. A request that ran already runs twice; its first answer wins."""
        unanswered = self.ledger.waiting()
        logger.warning("%s; sending %d unanswered requests again", reason, len(unanswered))
        if unanswered and self._send(unanswered, time.monotonic() + SEND_RETRY_S) is not None:
            raise ConnectionError(f"could not send again after {reason}")

    # closing

    def stop(self, deadline: float) -> None:
        if self._scheduler is not None and self._scheduler.stats is not None:
            self._scheduler.stats.unwatch_broker(self)
        self._stopping.set()
        self.ledger.abandon.set()
        if threading.current_thread() is not self._collector:
            self._collector.join(max(0.0, deadline - time.monotonic()) + _BLOCK_MS / 1000 + 1.0)
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
