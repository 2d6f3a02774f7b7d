"""The Redis backend: web processes enqueue, model workers anywhere consume.

How data moves, for a prefix ``P`` (keys under ``streamer:P``)::

    web process (RedisStreamer)           Redis                               worker process (RedisWorker)
    ---------------------------           -----                               ----------------------------
    submit(batch): encode each input
    dispatcher: XADD one entry       -->  streamer:P:requests  (a stream,  -->  XREADGROUP ">" COUNT (what it is
      per input                           consumer group "workers")              about to run), batching by the
                                                                                 same rule as in-process
                                                                               run_batch(model)
    collector: XREAD from its last   <--  streamer:P:results:<client>     <--  MULTI: XADD each result, XACK and
      id, deliver to the futures          (a stream per web process)             XDEL the requests; EXEC

    A worker's heartbeat (XCLAIM ... JUSTID) keeps the entries it runs from
    going idle; entries idle longer than ``claim_after`` belong to a worker
    that died and are XAUTOCLAIMed by another, which runs them one at a time
    (and fails one that has already been in ``max_item_crashes`` dead
    workers' hands). Results go to a stream, not PUBLISH: a web process that
    loses its connection reads on from its last id when it is back. When the
    Redis server restarts empty, each web process sends again what it has not
    been answered for, and workers recreate the consumer group.

Nothing read from Redis is unpickled unless both sides chose ``codec="pickle"``:
see :mod:`streamer_core.codec`.
"""

from __future__ import annotations

import itertools
import logging
import queue
import multiprocessing
import multiprocessing.connection
import os
import signal
import socket
import threading
import time
import uuid
from typing import Any, Dict, List, NamedTuple, Optional, Sequence, Tuple

from ..batching import HoldPolicy, Scheduler, _Item, deliver
from ..codec import Codec, decode_error, encode_error, get_codec
from ..config import (
    DEFAULT_MAX_LATENCY,
    DEFAULT_TIMEOUT,
    BatchingConfig,
    DeviceId,
    _check_int,
    _check_seconds,
    check_devices,
)
from ..errors import (
    BrokerUnavailableError,
    NoWorkerError,
    QueueFullError,
    SerializationError,
    WorkerDiedError,
    WorkerStartError,
)
from ..managed_model import check_model, load_predict
from ..runner import run_batch
from ..streamer import Backend, BaseStreamer, callable_name

__all__ = [
    "RedisStreamer",
    "RedisWorker",
    "run_redis_workers_forever",
    "run_worker_groups",
    "WorkerGroup",
    "wait_for_broker",
    "redact_url",
    "connect",
    "Keys",
]

logger = logging.getLogger("streamer_core.redis")

GROUP = "workers"
# Items sent to Redis in one pipeline by a web process.
_SEND_BATCH = 256
# Result streams of web processes that stopped reading expire after this long.
_RESULTS_TTL_S = 300
_RESULTS_MAXLEN = 100_000
# How often a web process checks the server is the same one (a restart empties it).
_CHECK_SERVER_S = 1.0
_BLOCK_MS = 500
_MAX_BACKOFF_S = 2.0
# Workers beat into the workers set at least this often (seconds); a worker
# whose last beat is older than _PRESENCE_MS is taken for dead.
_BEAT_S = 1.0
_PRESENCE_MS = 3000
_PRESENCE_TTL_MS = 60_000
# With require_workers, a web process refuses calls once it has seen no live
# worker for this long (seconds); its check runs every _CHECK_SERVER_S.
_NO_WORKER_S = 2.5
# Record this worker's beat, by the server's clock.
_BEAT_SCRIPT = """
local t = redis.call('TIME')
local ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZADD', KEYS[1], ms, ARGV[1])
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return ms
"""
# How many workers beat within the last ARGV[1] ms, by the server's clock;
# forgets workers silent for ten times that.
_LIVE_WORKERS_SCRIPT = """
local t = redis.call('TIME')
local ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local window = tonumber(ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', ms - 10 * window)
return redis.call('ZCOUNT', KEYS[1], ms - window, '+inf')
"""
# Exit code of a worker process whose model could not load: not restarted.
EXIT_INIT_FAILED = 3


def connect(redis_broker: str) -> Any:
    """A client for ``redis_broker``: ``"host:port"`` (service_streamer's
    form) or a URL, ``redis://[:password@]host:port/db``, ``rediss://`` for
    TLS, ``unix:///path``."""
    import redis
    from redis.backoff import NoBackoff
    from redis.retry import Retry

    # One immediate retry (a pooled connection that went stale); the callers'
    # own loops do the rest, so an unreachable server is reported in seconds.
    options = {
        "socket_connect_timeout": 2.0,
        "socket_timeout": 10.0,
        "health_check_interval": 15,
        "retry": Retry(NoBackoff(), 1),
    }
    if "://" in redis_broker:
        return redis.Redis.from_url(redis_broker, **options)
    host, _, port = redis_broker.rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"redis_broker must be 'host:port' or a redis:// URL, got {redis_broker!r}")
    return redis.Redis(host=host, port=int(port), **options)


def _broker_errors() -> Tuple[type, ...]:
    import redis

    return (redis.ConnectionError, redis.TimeoutError, ConnectionError, OSError)


class Keys:
    """The Redis keys of one prefix; ``prefix`` keeps models apart."""

    def __init__(self, prefix: str) -> None:
        if not isinstance(prefix, str):
            raise TypeError(f"prefix must be a str, got {prefix!r}")
        self.namespace = f"streamer:{prefix}" if prefix else "streamer"
        self.requests = f"{self.namespace}:requests"
        self.workers = f"{self.namespace}:workers"  # a sorted set: worker -> its last beat, server ms

    def results(self, client_id: str) -> str:
        return f"{self.namespace}:results:{client_id}"


def _field(fields: Dict[bytes, bytes], name: bytes) -> bytes:
    value = fields.get(name)
    if value is None:
        raise KeyError(name.decode())
    return value


# -- the web side ----------------------------------------------------------------


class _RedisClientBackend(Backend):
    name = "redis"
    copies_inputs = True

    def __init__(self, redis_broker: str, prefix: str, codec: str, require_workers: bool = False) -> None:
        self._require_workers = require_workers
        self._workers_seen = float("-inf")  # monotonic time a live worker was last seen
        self._workers_checked = False
        self._codec = get_codec(codec)
        self._errors_codec = get_codec("msgpack")
        self._keys = Keys(prefix)
        self._client_id = uuid.uuid4().hex
        self._results_key = self._keys.results(self._client_id)
        self._send_conn = connect(redis_broker)
        self._read_conn = connect(redis_broker)
        self._pending: Dict[str, _Item] = {}  # sent, not answered yet; by item id
        self._entries: Dict[str, bytes] = {}  # their stream entry ids
        self._abandoned: List[bytes] = []  # entries of calls that ended unanswered: to delete
        self._lock = threading.Lock()
        self._ids = itertools.count()
        self._stopping = threading.Event()
        self._server_id: Optional[str] = None
        self._scheduler: Optional[Scheduler] = None
        self._collector = threading.Thread(target=self._collect, name="streamer-redis-collect", daemon=True)
        self._abandon = threading.Event()
        self._deleter = threading.Thread(target=self._delete_abandoned, name="streamer-redis-delete", daemon=True)

    def start(self, scheduler: Scheduler) -> None:
        self._scheduler = scheduler
        try:
            self._server_id = self._server_run_id(self._send_conn)
            if self._require_workers:
                self._check_workers()  # now, so that the first calls are judged as the later ones
        except _broker_errors() as exc:
            logger.warning("Redis is not reachable yet (%s); calls fail until it is", exc)
        scheduler.add_slot()
        self._collector.start()
        self._deleter.start()

    def encode(self, value: Any, index: int) -> bytes:
        try:
            return self._codec.encode(value)
        except SerializationError as exc:
            raise SerializationError(f"input {index}: {exc}") from exc

    # sending

    def run(self, items: List[_Item], held: int) -> None:
        scheduler = self._scheduler
        assert scheduler is not None
        sent = []
        with self._lock:
            for item in items:
                if item.task.live():
                    item_id = str(next(self._ids))
                    self._pending[item_id] = item
                    sent.append((item_id, item))
        # The items are Redis's now: this side only waits for their answers.
        scheduler.batch_done(0, 0.0, held)
        if sent and not self._send(sent):
            error = BrokerUnavailableError("Redis cannot be reached: the call was not queued; retry later")
            with self._lock:
                for item_id, item in sent:
                    self._pending.pop(item_id, None)
                    item.task.fail(error)
            return
        for item_id, item in sent:
            future = item.task.future
            if future is not None:
                future.add_done_callback(lambda _, item_id=item_id: self._call_ended(item_id))

    def _call_ended(self, item_id: str) -> None:
        """A call is over. If this input is still unanswered (its caller gave
        up, or it timed out), delete its request, so that a worker that has
        not read it yet never runs it."""
        with self._lock:
            entry_id = self._entries.pop(item_id, None)
            if self._pending.pop(item_id, None) is not None and entry_id is not None:
                self._abandoned.append(entry_id)
                self._abandon.set()

    def _delete_abandoned(self) -> None:
        """Delete the requests of calls that ended unanswered, as soon as they
        end (a thread of its own: the caller giving up must not wait on Redis)."""
        while not self._stopping.is_set():
            self._abandon.wait(0.5)
            self._abandon.clear()
            with self._lock:
                abandoned, self._abandoned = self._abandoned, []
            if abandoned:
                try:
                    self._send_conn.xdel(self._keys.requests, *abandoned)
                except _broker_errors():
                    pass  # gone with Redis, or workers skip them when their deadline passes

    def _send(self, entries: Sequence[Tuple[str, _Item]]) -> bool:
        """XADD the entries, retrying briefly through a blip."""
        for attempt in range(4):
            try:
                pipe = self._send_conn.pipeline(transaction=False)
                now = time.monotonic()
                sent = []
                for item_id, item in entries:
                    future = item.task.future
                    if future is None:
                        continue
                    remaining_ms = max(1, int((future._deadline - now) * 1000))
                    fields = {"c": self._client_id, "i": item_id, "t": remaining_ms, "k": self._codec.name, "p": item.value}
                    pipe.xadd(self._keys.requests, fields)
                    sent.append(item_id)
                entry_ids = pipe.execute()
                with self._lock:
                    for item_id, entry_id in zip(sent, entry_ids):
                        if item_id in self._pending:
                            self._entries[item_id] = entry_id
                return True
            except _broker_errors() as exc:
                logger.warning("could not send to Redis (%s); retrying", exc)
                time.sleep(0.1 * 2**attempt)
        return False

    # receiving

    def _collect(self) -> None:
        last_id = "0-0"
        next_check = 0.0
        failing_since: Optional[float] = None
        while not self._stopping.is_set():
            try:
                now = time.monotonic()
                if now >= next_check:
                    next_check = now + _CHECK_SERVER_S
                    if self._server_restarted():
                        last_id = "0-0"
                    self._read_conn.expire(self._results_key, _RESULTS_TTL_S)
                    if self._require_workers:
                        self._check_workers()
                reply = self._read_conn.xread({self._results_key: last_id}, count=1000, block=_BLOCK_MS)
                if failing_since is not None:
                    logger.warning("Redis is reachable again")
                    failing_since = None
                if reply:
                    entries = reply[0][1]
                    self._on_results(entries)
                    last_id = entries[-1][0]
                    self._read_conn.xtrim(self._results_key, minid=last_id)
            except _broker_errors() as exc:
                if failing_since is None:
                    failing_since = time.monotonic()
                    logger.warning("lost Redis (%s); reconnecting", exc)
                next_check = 0.0
                self._stopping.wait(min(_MAX_BACKOFF_S, 0.05 + (time.monotonic() - failing_since) / 4))
            except Exception:
                logger.exception("error in the Redis result collector; it keeps running")
                self._stopping.wait(0.1)

    def _on_results(self, entries: List[Tuple[bytes, Dict[bytes, bytes]]]) -> None:
        items, outcomes = [], []
        with self._lock:
            for _, fields in entries:
                item = self._pending.pop(fields.get(b"i", b"").decode(), None)
                if item is None:
                    continue  # answered already (sent twice after a restart) or given up
                items.append(item)
                outcomes.append(self._decode_result(fields))
        deliver(items, outcomes)

    def _decode_result(self, fields: Dict[bytes, bytes]) -> Tuple[bool, Any]:
        codec = fields.get(b"k", self._codec.name.encode()).decode(errors="replace")
        try:
            if codec == self._codec.name:
                value = self._codec.decode(_field(fields, b"p"))
            elif codec == "msgpack":  # plain data: safe to read whatever this side's codec
                value = self._errors_codec.decode(_field(fields, b"p"))
            else:
                raise SerializationError(f"refusing a {codec!r} answer: this side reads {self._codec.name!r}")
        except Exception as exc:
            logger.warning("refused a result from Redis: %s", exc)
            return False, SerializationError(f"the worker's answer could not be read: {exc}")
        if fields.get(b"ok") == b"1":
            return True, value
        return False, decode_error(value)

    def _check_workers(self, conn: Any = None) -> int:
        live = self.live_workers(conn or self._read_conn)
        self._workers_checked = True
        return live

    def live_workers(self, conn: Any = None) -> int:
        """How many workers serve this prefix now (beat within the last
        ``_PRESENCE_MS``), by asking Redis."""
        live = int((conn or self._send_conn).eval(_LIVE_WORKERS_SCRIPT, 1, self._keys.workers, _PRESENCE_MS))
        if live:
            self._workers_seen = time.monotonic()
        return live

    def wait_ready(self, timeout: float) -> bool:
        """Wait until a worker serves this prefix; whether one did in time."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                if self.live_workers():
                    return True
            except _broker_errors():
                pass
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.05)

    def workers_missing(self) -> bool:
        """With ``require_workers``: whether no worker has been alive for
        ``_NO_WORKER_S`` seconds (or at all since this process started)."""
        if not (self._require_workers and self._workers_checked):
            return False
        return time.monotonic() - self._workers_seen > _NO_WORKER_S

    def _server_run_id(self, conn: Any) -> str:
        return str(conn.info("server")["run_id"])

    def _server_restarted(self) -> bool:
        """Whether the server is not the one the pending items were sent to; if
        so, send them again (a restarted server has lost them)."""
        run_id = self._server_run_id(self._read_conn)
        if run_id == self._server_id:
            return False
        first = self._server_id is None
        self._server_id = run_id
        if first:
            return False
        with self._lock:
            unanswered = [(item_id, item) for item_id, item in self._pending.items() if item.task.live()]
        logger.warning("the Redis server restarted; sending %d unanswered requests again", len(unanswered))
        if unanswered and not self._send(unanswered):
            raise ConnectionError("could not send again after a Redis restart")
        return True

    # closing

    def drain(self, deadline: float) -> None:
        while time.monotonic() < deadline:
            with self._lock:
                if not any(item.task.live() for item in self._pending.values()):
                    return
            time.sleep(0.01)

    def stop(self, deadline: float) -> None:
        self._stopping.set()
        self._abandon.set()
        if threading.current_thread() is not self._collector:
            self._collector.join(max(0.0, deadline - time.monotonic()) + _BLOCK_MS / 1000 + 1.0)
            self._deleter.join(1.0)
        try:
            self._read_conn.delete(self._results_key)
        except _broker_errors():
            pass
        self._send_conn.close()
        self._read_conn.close()

    def unanswered(self) -> int:
        """Inputs sent and not answered yet, of calls still running."""
        with self._lock:
            return len(self._pending)  # each call's end removes its inputs (_call_ended)


class RedisStreamer(BaseStreamer):
    """The web side of the Redis backend: queue inputs for workers that run
    elsewhere (:class:`RedisWorker`, ``run_redis_workers_forever`` or the
    ``streamer-worker`` command) and wait for their answers.

    ``redis_broker`` is ``"host:port"`` or a ``redis://`` / ``rediss://`` URL;
    ``prefix`` keeps models apart on one Redis (workers use the same one).
    Keyword-only: ``timeout`` (seconds a call may take, default 20),
    ``max_queue`` (the most inputs of this web process waiting for an answer,
    sent or not; past it calls fail at once with ``QueueFullError``), and
    ``codec`` (``"msgpack"``, the default, or ``"pickle"``, which the workers
    must be started with too), and ``require_workers`` (default False: calls
    wait in Redis for a worker to come; True: while no worker has been alive
    for a few seconds, calls fail at once with :class:`NoWorkerError`, as a
    web service wants). Same signature as service_streamer's
    ``RedisStreamer``.
    """

    def __init__(
        self,
        redis_broker: str = "localhost:6379",
        prefix: str = "",
        *,
        timeout: float = DEFAULT_TIMEOUT,
        max_queue: Optional[int] = None,
        codec: str = "msgpack",
        require_workers: bool = False,
    ) -> None:
        config = BatchingConfig(_SEND_BATCH, 0.0, timeout, max_queue)
        if not isinstance(require_workers, bool):
            raise TypeError(f"require_workers must be True or False, got {require_workers!r}")
        self._backend = _RedisClientBackend(redis_broker, prefix, codec, require_workers)
        super().__init__(config, self._backend)

    def submit(self, batch: Any, timeout: Optional[float] = None) -> Any:
        if self._backend.workers_missing():
            raise NoWorkerError(
                f"no worker serves {self._backend._keys.requests} (none has been alive for {_NO_WORKER_S:g}s): "
                "start workers (streamer-worker, flask streamer run-workers or manage.py run_gpu_workers), "
                "then retry"
            )
        limit = self._config.max_queue
        if limit is not None and not isinstance(batch, (str, bytes)):
            batch = list(batch)
            waiting = self._backend.unanswered() + self.queued()
            if waiting + len(batch) > limit:
                raise QueueFullError(
                    f"{waiting} inputs of this process wait for an answer and max_queue is {limit}: "
                    "retry later, add workers, or raise max_queue"
                )
        return super().submit(batch, timeout)

    submit.__doc__ = BaseStreamer.submit.__doc__

    def live_workers(self) -> int:
        """How many workers serve this prefix right now (a health check);
        raises :class:`BrokerUnavailableError` when Redis cannot be reached."""
        try:
            return self._backend.live_workers()
        except _broker_errors() as exc:
            raise BrokerUnavailableError(f"Redis cannot be reached: {exc}") from exc

    def wait_ready(self, timeout: float = 60.0) -> bool:
        """Wait until at least one worker serves this prefix (workers load
        their model before they announce themselves); return whether one
        did within ``timeout`` seconds."""
        return self._backend.wait_ready(timeout)


# -- the worker side -------------------------------------------------------------


class _Request(NamedTuple):
    entry_id: bytes
    client: str
    item_id: str
    codec: str
    payload: bytes


class RedisWorker:
    """A model worker for the Redis backend: takes batches of requests from
    the stream, runs them, and answers each web process.

    Same signature as service_streamer's ``RedisWorker``; ``model_class`` is a
    :class:`ManagedModel` subclass (built in :meth:`run_forever`) or a
    function taking a list. Keyword-only: ``codec`` (``"msgpack"``, or
    ``"pickle"`` to accept pickled inputs from a trusted broker),
    ``isolate_errors``, ``claim_after`` (seconds an entry may go without a
    heartbeat before another worker takes it over, default 2) and
    ``max_item_crashes`` (default 2).
    """

    def __init__(
        self,
        model_class: Any,
        batch_size: int,
        max_latency: float = DEFAULT_MAX_LATENCY,
        redis_broker: str = "localhost:6379",
        prefix: str = "",
        model_init_args: Optional[Sequence[Any]] = None,
        model_init_kwargs: Optional[Dict[str, Any]] = None,
        *,
        codec: str = "msgpack",
        isolate_errors: bool = True,
        claim_after: float = 2.0,
        max_item_crashes: int = 2,
    ) -> None:
        self._config = BatchingConfig(batch_size, max_latency, isolate_errors=isolate_errors)
        check_model("model_class", model_class)
        self._model_class = model_class
        self._init_args = tuple(model_init_args or ())
        self._init_kwargs = dict(model_init_kwargs or {})
        self._codec: Codec = get_codec(codec)
        self._errors_codec: Codec = get_codec("msgpack")
        self._claim_after = _check_seconds("claim_after", claim_after, allow_zero=False)
        self._max_item_crashes = _check_int("max_item_crashes", max_item_crashes, 1)
        self._broker = redis_broker
        self._keys = Keys(prefix)
        connect(redis_broker)  # validates the address now; connects lazily
        self._stopping = threading.Event()
        # Requests this worker runs or is answering: the heartbeat keeps them ours.
        self._held: Dict[bytes, None] = {}
        self._held_lock = threading.Lock()
        # Answers wait here for the writer thread, so writing a batch's
        # answers overlaps reading and running the next one.
        self._outbox: "queue.Queue[Optional[Tuple[List[_Request], List[Any], float]]]" = queue.Queue(maxsize=2)
        self._policy = HoldPolicy(self._config.max_latency)
        self._policy_lock = threading.Lock()
        self._conn: Any = None
        self._server_offset_ms = 0.0
        self._server_checked = float("-inf")
        self._next_claim = 0.0
        self._next_sweep = 0.0
        self.consumer = ""

    def stop(self) -> None:
        """Finish the batch in hand, then return from :meth:`run_forever`."""
        self._stopping.set()

    def run_forever(self, gpu_id: Optional[DeviceId] = None) -> None:
        """Load the model and serve until :meth:`stop` or SIGTERM, which lets
        the batch in hand finish first. Raises :class:`WorkerStartError` if
        the model cannot be loaded."""
        if gpu_id is not None:
            os.environ["CUDA_VISIBLE_DEVICES"] = str(gpu_id)
        predict = self._load_model(gpu_id)
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, lambda *_: self.stop())
        self.consumer = f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        self._conn = connect(self._broker)
        heartbeat = threading.Thread(target=self._heartbeat, name="streamer-redis-heartbeat", daemon=True)
        writer = threading.Thread(target=self._write_answers, name="streamer-redis-writer", daemon=True)
        heartbeat.start()
        writer.start()
        logger.info("worker %s serving %s", self.consumer, self._keys.requests)
        try:
            self._serve(predict)
        finally:
            self._stopping.set()  # ends the heartbeat, and bounds the writer's retries
            self._outbox.put(None)  # the writer answers what is in hand, then ends
            writer.join()
            self._leave_group()
            self._conn.close()
        logger.info("worker %s stopped", self.consumer)

    def _serve(self, predict: Any) -> None:
        import redis

        failing_since: Optional[float] = None
        while not self._stopping.is_set():
            try:
                self._ensure_group()
                batch = self._next_batch()
                if failing_since is not None:
                    logger.warning("Redis is reachable again")
                    failing_since = None
                if batch:
                    self._run(predict, batch)
            except _broker_errors() as exc:
                if failing_since is None:
                    failing_since = time.monotonic()
                    logger.warning("lost Redis (%s); retrying", exc)
                self._group_ready = False
                self._stopping.wait(min(_MAX_BACKOFF_S, 0.05 + (time.monotonic() - failing_since) / 4))
            except redis.ResponseError as exc:
                if "NOGROUP" not in str(exc):
                    raise
                logger.warning("the consumer group is gone (the Redis server restarted empty); recreating it")
                self._group_ready = False

    def _load_model(self, gpu_id: Optional[DeviceId]) -> Any:
        try:
            return load_predict(self._model_class, gpu_id, self._init_args, self._init_kwargs)
        except Exception as exc:
            raise WorkerStartError(f"could not load {callable_name(self._model_class)}: {exc!r}") from exc

    # reading

    _group_ready = False

    def _ensure_group(self) -> None:
        if self._group_ready:
            return
        import redis

        try:
            self._conn.xgroup_create(self._keys.requests, GROUP, id="0", mkstream=True)
        except redis.ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise
        self._group_ready = True

    def _next_batch(self) -> List[_Request]:
        """Read requests until a batch should run, by the in-process rule;
        requests taken over from a dead worker run one at a time."""
        size = self._config.batch_size
        batch: List[_Request] = []
        first_seen = hold_until = 0.0
        while True:
            now = time.monotonic()
            if not batch:
                if self._stopping.is_set():
                    return batch
                orphan = self._claim_orphan(now)
                if orphan is not None:
                    self._next_claim = now  # there may be more: take the next one right after
                    return [orphan]
            block_ms = _BLOCK_MS if not batch else max(1, int((hold_until - now) * 1000))
            reply = self._conn.xreadgroup(
                GROUP, self.consumer, {self._keys.requests: ">"}, count=size - len(batch), block=block_ms
            )
            now = time.monotonic()
            got = self._accept(reply[0][1] if reply else [])
            with self._policy_lock:
                if got:
                    if not batch:
                        first_seen = now
                    batch.extend(got)
                    self._policy.arrived(len(got), now)
                if batch:
                    hold_until = self._policy.hold_until(first_seen, now)
                if len(batch) >= size or now >= hold_until or self._stopping.is_set():
                    return batch

    def _accept(self, entries: List[Tuple[bytes, Dict[bytes, bytes]]]) -> List[_Request]:
        """Requests worth running; expired and malformed ones are acked away."""
        accepted, drop = [], []
        server_now_ms = self._server_now_ms()
        for entry_id, fields in entries:
            try:
                created_ms = int(entry_id.split(b"-")[0])
                timeout_ms = int(_field(fields, b"t"))
                request = _Request(
                    entry_id,
                    _field(fields, b"c").decode(),
                    _field(fields, b"i").decode(),
                    _field(fields, b"k").decode(),
                    _field(fields, b"p"),
                )
            except (KeyError, ValueError, UnicodeDecodeError) as exc:
                logger.warning("dropped a malformed request %s (missing or bad field %s)", entry_id, exc)
                drop.append(entry_id)
                continue
            if server_now_ms > created_ms + timeout_ms:
                drop.append(entry_id)  # its caller has given up
                continue
            accepted.append(request)
        if drop:
            pipe = self._conn.pipeline(transaction=True)
            pipe.xack(self._keys.requests, GROUP, *drop)
            pipe.xdel(self._keys.requests, *drop)
            pipe.execute()
        return accepted

    def _server_now_ms(self) -> float:
        """The Redis server's clock (entry ids are its time), from an offset
        refreshed now and then, so clocks of other machines do not matter."""
        now = time.monotonic()
        if now - self._server_checked > 30.0:
            seconds, micros = self._conn.time()
            self._server_offset_ms = seconds * 1000 + micros / 1000 - now * 1000
            self._server_checked = now
        return now * 1000 + self._server_offset_ms

    def _leave_group(self) -> None:
        """Remove this worker from the group, unless requests are pending
        under its name, by Redis's own count (a read whose reply was lost in
        a blip leaves some this worker never saw): removing the consumer would
        drop them, while left pending, another worker takes them over."""
        try:
            self._conn.zrem(self._keys.workers, self.consumer)
            if self._conn.xpending_range(self._keys.requests, GROUP, "-", "+", 1, self.consumer):
                return
            self._conn.xgroup_delconsumer(self._keys.requests, GROUP, self.consumer)
        except Exception as exc:  # the server may be gone; the next sweep removes us
            logger.debug("could not leave the group: %s", exc)

    def _sweep_consumers(self) -> None:
        """Remove consumers of dead workers: they hold nothing (their requests
        were taken over) and have not been seen for a long while."""
        idle_ms = int(max(60.0, 30 * self._claim_after) * 1000)
        for consumer in self._conn.xinfo_consumers(self._keys.requests, GROUP):
            name = consumer["name"].decode() if isinstance(consumer["name"], bytes) else consumer["name"]
            if name != self.consumer and consumer["pending"] == 0 and consumer["idle"] > idle_ms:
                self._conn.xgroup_delconsumer(self._keys.requests, GROUP, name)

    def _claim_orphan(self, now: float) -> Optional[_Request]:
        """Take over one request whose worker stopped its heartbeat (it died),
        to run it alone. One at a time, each run before the next is taken:
        a request's delivery count then counts the workers that died while
        they held it, and nothing taken over waits without a heartbeat."""
        if now < self._next_claim:
            return None
        if now >= self._next_sweep:
            self._next_sweep = now + 60.0
            self._sweep_consumers()
        while True:
            reply = self._conn.xautoclaim(
                self._keys.requests, GROUP, self.consumer, int(self._claim_after * 1000), "0-0", count=1
            )
            claimed, deleted = reply[1], (reply[2] if len(reply) > 2 else [])
            if deleted:
                self._conn.xack(self._keys.requests, GROUP, *deleted)
            claimed = [entry for entry in claimed if entry[1]]
            if not claimed:
                self._next_claim = now + self._claim_after / 2  # none left: look again later
                return None
            entry_id = claimed[0][0]
            [pending] = self._conn.xpending_range(self._keys.requests, GROUP, entry_id, entry_id, 1) or [{}]
            crashes = pending.get("times_delivered", 1) - 1
            accepted = self._accept(claimed)
            if not accepted:
                continue  # expired or malformed, and acked away
            request = accepted[0]
            logger.warning("took over request %s from a worker that stopped answering", entry_id.decode())
            if crashes < self._max_item_crashes:
                return request
            error = WorkerDiedError(
                f"this input was in the hands of {crashes} workers that died, so it is not retried "
                "(it may be what kills them)"
            )
            self._hold([request])
            self._outbox.put(([request], [(False, error)], 0.0))

    def _heartbeat(self) -> None:
        """Keep the requests in hand from looking abandoned while the model runs."""
        conn = connect(self._broker)
        self._beat(conn)
        while not self._stopping.wait(min(_BEAT_S, self._claim_after / 3)):
            self._beat(conn)
            with self._held_lock:
                in_hand = list(self._held)
            if in_hand:
                try:
                    conn.xclaim(self._keys.requests, GROUP, self.consumer, 0, in_hand, justid=True)
                except Exception as exc:  # a blip: the next beat tries again
                    logger.debug("heartbeat failed: %s", exc)
        conn.close()

    def _beat(self, conn: Any) -> None:
        """Tell web processes this worker is alive (see ``require_workers``)."""
        try:
            conn.eval(_BEAT_SCRIPT, 1, self._keys.workers, self.consumer, _PRESENCE_TTL_MS)
        except Exception as exc:  # a blip: the next beat tries again
            logger.debug("presence beat failed: %s", exc)

    # running and answering

    def _hold(self, batch: Sequence[_Request]) -> None:
        with self._held_lock:
            for request in batch:
                self._held[request.entry_id] = None

    def _run(self, predict: Any, batch: List[_Request]) -> None:
        self._hold(batch)
        outcomes: List[Optional[Tuple[bool, Any]]] = [None] * len(batch)
        inputs, positions = [], []
        for position, request in enumerate(batch):
            if request.codec != self._codec.name:
                logger.warning(
                    "refused a %r payload from client %s: this worker reads only %r (start it with codec=%r "
                    "to accept it, if the broker is trusted)",
                    request.codec, request.client, self._codec.name, request.codec,
                )
                error = SerializationError(f"the worker refuses {request.codec!r} payloads; it reads {self._codec.name!r}")
                outcomes[position] = (False, error)
                continue
            try:
                inputs.append(self._codec.decode(request.payload))
                positions.append(position)
            except Exception as exc:
                logger.warning("rejected a payload from client %s: %s", request.client, exc)
                outcomes[position] = (False, SerializationError(f"the worker could not read this input: {exc}"))
        started = time.monotonic()
        if inputs:
            for position, outcome in zip(positions, run_batch(predict, inputs, self._config.isolate_errors)):
                outcomes[position] = outcome
        self._outbox.put((batch, outcomes, time.monotonic() - started))

    def _write_answers(self) -> None:
        """The writer thread: answer each batch, then count its callers as
        expected back (from when they can see their answers)."""
        conn = connect(self._broker)
        while True:
            job = self._outbox.get()
            if job is None:
                break
            batch, outcomes, seconds = job
            if self._answer(conn, batch, outcomes) and seconds:
                with self._policy_lock:
                    self._policy.delivered(len(batch), seconds, time.monotonic())
            with self._held_lock:
                for request in batch:
                    self._held.pop(request.entry_id, None)
        conn.close()

    def _answer(self, conn: Any, batch: Sequence[_Request], outcomes: Sequence[Any]) -> bool:
        """Write every result and acknowledge the requests, in one transaction.
        Through a Redis blip keep trying, since these answers are not kept
        anywhere else; once stopping, give up after a while (the requests stay
        pending, and another worker takes them over)."""
        fields = [self._result_fields(request, outcome) for request, outcome in zip(batch, outcomes)]
        ids = [request.entry_id for request in batch]
        keys = {self._keys.results(request.client) for request in batch}
        delay, give_up_at = 0.05, None
        while True:
            try:
                pipe = conn.pipeline(transaction=True)
                for request, entry in zip(batch, fields):
                    pipe.xadd(self._keys.results(request.client), entry, maxlen=_RESULTS_MAXLEN, approximate=True)
                for key in keys:
                    pipe.expire(key, _RESULTS_TTL_S)
                pipe.xack(self._keys.requests, GROUP, *ids)
                pipe.xdel(self._keys.requests, *ids)
                pipe.execute(raise_on_error=False)
                return True
            except _broker_errors() as exc:
                logger.warning("could not write %d results to Redis (%s); retrying", len(batch), exc)
                if self._stopping.is_set():
                    give_up_at = give_up_at or time.monotonic() + 10.0
                    if time.monotonic() > give_up_at:
                        logger.error("gave up writing %d results; another worker will run them again", len(batch))
                        return False
                time.sleep(delay)
                delay = min(_MAX_BACKOFF_S, delay * 2)

    def _result_fields(self, request: _Request, outcome: Tuple[bool, Any]) -> Dict[str, Any]:
        ok, value = outcome
        if ok and request.codec == self._codec.name:
            try:
                return {"i": request.item_id, "ok": "1", "k": self._codec.name, "p": self._codec.encode(value)}
            except SerializationError as exc:
                value = SerializationError(f"the model's result cannot be sent back: {exc}")
        # Errors are plain data: msgpack, which every web process can read safely.
        return {"i": request.item_id, "ok": "0", "k": "msgpack", "p": self._errors_codec.encode(encode_error(value))}


# -- running several workers ----------------------------------------------------------


def _worker_process(options: Dict[str, Any], gpu_id: Optional[DeviceId], parent_pid: int) -> None:
    from .process_worker import _watch_parent

    threading.Thread(target=_watch_parent, args=(parent_pid,), name="streamer-parent-watch", daemon=True).start()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the supervisor handles Ctrl-C
    logging.basicConfig(level=options.pop("log_level", logging.INFO), format="%(asctime)s %(name)s[%(process)d] %(message)s")
    worker = RedisWorker(**options)
    try:
        worker.run_forever(gpu_id)
    except WorkerStartError:
        logger.exception("the model could not be loaded; this worker is not restarted")
        os._exit(EXIT_INIT_FAILED)


class WorkerGroup(NamedTuple):
    """The Redis workers of one model, as a supervisor runs them: ``options``
    are :class:`RedisWorker`'s keyword arguments; worker ``i`` gets device
    ``devices[i % len(devices)]``. ``name`` is used in log lines."""

    name: str
    options: Dict[str, Any]
    worker_num: int = 1
    devices: Optional[Tuple[DeviceId, ...]] = None


def run_redis_workers_forever(
    model_class: Any,
    batch_size: int,
    max_latency: float = DEFAULT_MAX_LATENCY,
    worker_num: int = 1,
    cuda_devices: Optional[Sequence[DeviceId]] = None,
    redis_broker: str = "localhost:6379",
    prefix: str = "",
    model_init_args: Optional[Sequence[Any]] = None,
    model_init_kwargs: Optional[Dict[str, Any]] = None,
    **options: Any,
) -> int:
    """Run ``worker_num`` :class:`RedisWorker` processes, worker ``i`` on
    device ``cuda_devices[i % len(cuda_devices)]``, and keep them running:
    one that dies is started again (one whose model cannot load is not).
    SIGTERM or Ctrl-C lets every worker finish its batch in hand, then
    returns 0. Extra keyword options go to :class:`RedisWorker`.

    Same signature as service_streamer's ``run_redis_workers_forever``.
    """
    worker_options = dict(
        model_class=model_class, batch_size=batch_size, max_latency=max_latency, redis_broker=redis_broker,
        prefix=prefix, model_init_args=model_init_args, model_init_kwargs=model_init_kwargs, **options,
    )
    group = WorkerGroup(callable_name(model_class), worker_options, worker_num, check_devices("cuda_devices", cuda_devices))
    return run_worker_groups([group])


def redact_url(url: str) -> str:
    """``url`` with its password (and user) hidden, for log lines."""
    scheme, sep, rest = url.partition("://")
    if sep and "@" in rest:
        return f"{scheme}://***@{rest.rpartition('@')[2]}"
    return url


def wait_for_broker(redis_broker: str, stopping: threading.Event, log_every: float = 30.0) -> bool:
    """Block until ``redis_broker`` answers PING (return True) or ``stopping``
    is set (False), logging one clear line when it does not answer and again
    every ``log_every`` seconds, rather than a traceback per attempt."""
    conn = connect(redis_broker)
    failing_since: Optional[float] = None
    next_log = 0.0
    try:
        while not stopping.is_set():
            try:
                conn.ping()
                if failing_since is not None:
                    logger.warning("Redis at %s answers now; starting workers", redact_url(redis_broker))
                return True
            except _broker_errors() as exc:
                now = time.monotonic()
                if failing_since is None:
                    failing_since = now
                if now >= next_log:
                    next_log = now + log_every
                    logger.error(
                        "Redis at %s does not answer (%s); retrying until it does (Ctrl-C to stop)",
                        redact_url(redis_broker), exc,
                    )
                stopping.wait(min(_MAX_BACKOFF_S, 0.25 + (now - failing_since) / 4))
        return False
    finally:
        conn.close()


def run_worker_groups(groups: Sequence[WorkerGroup]) -> int:
    """Run the workers of every group in spawned processes and keep them
    running until SIGTERM or Ctrl-C (in the main thread), then let each finish
    its batch in hand and return 0. A worker that dies is restarted, with a
    growing pause; one whose model cannot load is not. Returns 1 if every
    worker has failed to load its model. Waits for Redis first, logging
    while it does not answer.

    Everything is validated before any process starts: a bad option raises
    ``TypeError`` or ``ValueError`` here.
    """
    slots: List[Tuple[WorkerGroup, int, Optional[DeviceId]]] = []
    for group in groups:
        _check_int(f"worker_num of {group.name}", group.worker_num, 1)
        devices = check_devices(f"cuda_devices of {group.name}", group.devices)
        RedisWorker(**group.options)  # validate everything here, before any process starts
        for i in range(group.worker_num):
            slots.append((group, i, devices[i % len(devices)] if devices else None))
    if not slots:
        raise ValueError("no workers to run: give at least one model")
    log_level = logging.getLogger().getEffectiveLevel()
    context = multiprocessing.get_context("spawn")
    processes: List[Optional[Any]] = [None] * len(slots)
    restarts = [0] * len(slots)
    stopping = threading.Event()

    def start(n: int) -> None:
        group, i, gpu_id = slots[n]
        options = dict(group.options, log_level=log_level)
        process = context.Process(
            target=_worker_process, args=(options, gpu_id, os.getpid()), name=f"streamer-redis-{group.name}-{i}"
        )
        process.start()
        processes[n] = process
        logger.info("%s worker %d (pid %d) started on device %s", group.name, i, process.pid, gpu_id)

    def on_signal(signum: int, _frame: Any) -> None:
        logger.info("received %s: letting workers finish their batches", signal.Signals(signum).name)
        stopping.set()

    in_main = threading.current_thread() is threading.main_thread()
    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGTERM, signal.SIGINT)} if in_main else {}
    try:
        for broker in dict.fromkeys(group.options.get("redis_broker", "localhost:6379") for group in groups):
            if not wait_for_broker(broker, stopping):
                return 0
        for n in range(len(slots)):
            start(n)
        while not stopping.is_set():
            alive = {p.sentinel: n for n, p in enumerate(processes) if p is not None}
            if not alive:
                logger.error("every worker failed to load its model; giving up")
                return 1
            for sentinel in multiprocessing.connection.wait(list(alive), timeout=0.5):
                n = alive[sentinel]
                process = processes[n]
                process.join()
                if stopping.is_set():
                    break
                group, i, _ = slots[n]
                if process.exitcode == EXIT_INIT_FAILED:
                    logger.error("%s worker %d could not load the model; not restarting it", group.name, i)
                    processes[n] = None
                    continue
                restarts[n] += 1
                logger.warning(
                    "%s worker %d (pid %d) exited with %s; restarting it", group.name, i, process.pid, process.exitcode
                )
                time.sleep(min(_MAX_BACKOFF_S, 0.1 * restarts[n]))
                start(n)
        for process in processes:
            if process is not None and process.is_alive():
                process.terminate()  # SIGTERM: the worker finishes its batch in hand
        for process in processes:
            if process is not None:
                process.join(60)
                if process.is_alive():
                    logger.warning("worker pid %d did not finish in 60 s; killing it", process.pid)
                    process.kill()
                    process.join(5)
        return 0
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
