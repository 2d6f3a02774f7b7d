"""The worker side of the Redis backend: :class:`RedisWorker` takes batches
of requests from the stream, runs the model on them, and answers each web
process on its results stream.

Three threads share the work, so that the model never waits on Redis::

    reader   XREADGROUP the next batch while the model runs the current one;
             parse and decode each request; claim requests of dead workers
    main     when the model is free: take the next batch (waiting for callers
             just answered, by the same rule as in-process), run the model
    writer   write the answers of a batch, acknowledge and delete its requests

    heartbeat  tell the web processes the worker lives; keep its requests claimed

The reader holds at most one batch beyond the one running (the only worker
alive, shaping by cost, two full batches' worth with the running one), so a
worker never has more than two batches' worth pending under its name (plus
the one being answered): a worker killed at any point loses nothing, since
what it held is taken over by the others after ``claim_after``.

This module holds the worker itself, its main thread and its reader's loop;
the reader's dealings with the stream are :mod:`.intake`'s, the writer is
:mod:`.answers`, the heartbeat :mod:`.presence`.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import threading
import time
import uuid
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Sequence, Set, Tuple

from ...codec import Codec, get_codec
from ...config import OPTIONS, BatchingConfig, DeviceId, ModelOptions, default
from ...errors import WorkerStartError
from ...green import Condition
from ...hold import HoldPolicy
from ...managed_model import check_model, freeze_loaded, load_predict, model_facts, ready_line
from ...oom import load_failure
from ...redis_address import DEFAULT_REDIS, AddressLike, RedisAddress
from ...runner import run_batch
from ...shaping import CostShaper
from ...stats import StreamerStats, stats_for
from ...streamer import callable_name
from .answers import AnswerWriter, Outcome
from .connection import (
    MAX_BACKOFF_S,
    LoopErrors,
    broker_errors,
    broker_problem,
    connect,
    setup_refused,
)
from .intake import Hands, Input, Intake, ServerClock
from .presence import Loading, ModelWatch, Presence
from .wire import GROUP, Keys, is_wrong_type, repair_key

if TYPE_CHECKING:
    from typing_extensions import Unpack

__all__ = ["RedisWorker"]

logger = logging.getLogger("streamer_core.redis")

# How long one blocking read waits for requests (ms): also how soon an idle
# reader notices it should stop.
_BLOCK_MS = 500
# How often a worker holding a partial batch looks for companions (seconds).
_HOLD_POLL_S = 0.001
# A batch whose requests were all read within this many seconds runs without
# asking Redis which of them their callers withdrew meanwhile (see
# RedisWorker._withdrawn): a caller rarely gives up within milliseconds of
# sending, and the question costs a round trip while every caller of the
# batch waits.
_RECHECK_AFTER_S = 0.01


class RedisWorker:
    """A model worker for the Redis backend: takes batches of requests from
    the stream, runs them, and answers each web process.

    Same signature as service_streamer's ``RedisWorker``; ``model_class`` is a
    :class:`ManagedModel` subclass (built in :meth:`run_forever`) or a
    function taking a list; ``redis_broker`` is where Redis is, in any form
    of :mod:`streamer_core.redis_address` (one server, Sentinels, a
    Cluster), as the web side's. Keyword-only: ``codec`` (``"msgpack"``, or
    ``"pickle"`` to accept pickled inputs from a trusted broker),
    ``isolate_errors``, ``claim_after`` (seconds an entry may go without a
    heartbeat before another worker takes it over, default 2),
    ``max_item_crashes`` (default 2), and the options that shape batches by
    cost, as on every streamer (:class:`~streamer_core.BatchingConfig`):
    ``max_batch_cost``, ``batch_cost``, ``oom_errors``, and ``item_cost``,
    used for requests whose web side sent no cost of its own; ``name``, the
    model's name in :meth:`stats` and the metrics (default ``prefix``);
    ``hang_timeout`` (seconds, default 60; ``None``: never): a worker that
    has run one batch this long while none of that batch's callers waits
    any more is taken for hung. Under :func:`run_redis_workers_forever` (and
    the worker commands) its process then exits, and is started again with
    twice the wait (twice its own if it had answered nothing);
    elsewhere it stops claiming its requests and showing itself alive, so
    other workers take them over, until the model returns.
    """

    def __init__(
        self,
        model_class: Any,
        batch_size: int,
        max_latency: float = default("max_latency"),
        redis_broker: AddressLike = DEFAULT_REDIS,
        prefix: str = "",
        model_init_args: Optional[Sequence[Any]] = None,
        model_init_kwargs: Optional[Dict[str, Any]] = None,
        *,
        codec: str = default("codec"),
        claim_after: float = default("claim_after"),
        max_item_crashes: int = default("max_item_crashes"),
        name: Optional[str] = None,
        hang_timeout: Optional[float] = default("hang_timeout"),
        **options: Unpack[ModelOptions],
    ) -> None:
        self._stats = stats_for((prefix or "redis") if name is None else name)  # checks the name first
        self._config = config = BatchingConfig(batch_size, max_latency, **options)
        # Batches are shaped by cost as in-process (see streamer_core.shaping).
        # The costs may be the web side's: a learned cap has no ceiling but
        # the budget.
        self._shaper = CostShaper(config, costed=True)
        self._shaping = self._shaper.active
        check_model("model_class", model_class)
        self._model_class = model_class
        self._init_args = tuple(model_init_args or ())
        self._init_kwargs = dict(model_init_kwargs or {})
        self._codec: Codec = get_codec(codec)
        self._errors_codec: Codec = get_codec("msgpack")
        self._claim_after: float = OPTIONS["claim_after"].checked(claim_after)
        self._max_item_crashes: int = OPTIONS["max_item_crashes"].checked(max_item_crashes)
        self._hang_timeout: Optional[float] = OPTIONS["hang_timeout"].checked(hang_timeout)
        # Set by the supervisor's worker processes: exit when hung, to be started again.
        self._exit_when_hung = False
        address = RedisAddress.of(redis_broker)
        self._address = address
        self._keys = Keys(prefix, address.is_cluster)
        self._stopping = threading.Event()
        # Requests this worker holds (read ahead, running, being answered):
        # the heartbeat keeps them ours.
        self._hands = Hands()
        # The batch the reader fills while the model runs, and the rule that
        # says when the main thread takes it; both under _cond.
        self._cond = Condition()
        self._next: List[Input] = []
        self._next_first_seen = 0.0
        self._next_alone = False  # a request taken over from a dead worker: it runs alone
        self._orphan_in_hand = False  # one at a time, each run before the next is claimed
        self._reader_done = False
        self._running = False  # the model is running a batch
        self._running_size = 0  # of how many requests
        # While the model runs a batch: since when, and until when its last
        # caller waits; read by the heartbeat thread.
        self._watch = ModelWatch()
        self._delivered_at_ms = 0.0  # when the last batch was answered, by the server's clock
        self._policy = HoldPolicy(self._config.max_latency)
        # Made by run_forever, for the threads it starts.
        self._conn: Any = None  # the reader's
        self._main_conn: Any = None
        self._clock: ServerClock = ServerClock(None)
        self._intake: Optional[Intake] = None
        self._writer: Optional[AnswerWriter] = None
        self._presence: Optional[Presence] = None
        self.consumer = ""
        self._serving = False
        self._predict: Optional[Callable[[List[Any]], Sequence[Any]]] = None  # the model's, once loaded

    def stats(self) -> StreamerStats:
        """This worker process's numbers: its batches, their queue waits (from
        each request's arrival in Redis) and model seconds, the inputs it
        holds read ahead (``queue_depth``) and whether it serves
        (``workers_live``). Calls are counted by the web processes."""
        return self._stats.snapshot()

    def gauges(self) -> Tuple[int, int]:
        """``(inputs read ahead, 1 while serving)``, for the stats."""
        with self._cond:
            return len(self._next), int(self._serving)

    def cost_cap(self) -> float:
        """The cap on a batch's cost learned from running out of memory
        (``inf``: none), for the stats."""
        return self._shaper.cap.limit

    def stop(self) -> None:
        """Finish the batches in hand, then return from :meth:`run_forever`."""
        self._stopping.set()
        with self._cond:
            self._cond.notify_all()

    def run_forever(self, gpu_id: Optional[DeviceId] = None) -> None:
        """Load the model and serve until :meth:`stop` or SIGTERM, which lets
        the batches in hand (the one running and the one read ahead) finish
        first. Raises :class:`WorkerStartError` if the model cannot be loaded."""
        if gpu_id is not None:
            os.environ["CUDA_VISIBLE_DEVICES"] = str(gpu_id)
        self._check_setup()  # before the model loads: a wrong URL is told at once
        self.consumer = f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        device = os.environ.get("CUDA_VISIBLE_DEVICES")  # set above from gpu_id, or by whoever started us
        about = {"host": socket.gethostname(), "pid": os.getpid(), "device": device}
        with Loading(self._address, self._keys, self.consumer, about):
            predict = self._predict = self._load_model(gpu_id)
        freeze_loaded()
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, lambda *_: self.stop())
        info = json.dumps(about)
        self._conn = connect(self._address)
        self._main_conn = connect(self._address)
        hands, clock = self._hands, ServerClock(self._conn, self._keys.requests)
        self._clock = clock
        self._intake = Intake(
            self._conn,
            self.consumer,
            self._keys,
            self._codec,
            self._config.item_cost,
            hands,
            clock,
            self._claim_after,
            self._max_item_crashes,
        )
        writer = self._writer = AnswerWriter(self._address, self._keys, self._codec, hands, clock, self._stopping)
        presence = self._presence = Presence(
            self._address,
            self._keys,
            self.consumer,
            info,
            hands,
            self._watch,
            self._claim_after,
            self._hang_timeout,
            self._stopping,
            self._exit_when_hung,
        )
        threads = {
            name: threading.Thread(target=target, name=f"streamer-redis-{name}", daemon=True)
            for name, target in (("heartbeat", presence.run), ("reader", self._read), ("writer", writer.run))
        }
        for thread in threads.values():
            thread.start()
        line = ready_line(model_facts(predict, gpu_id), self._config.batch_size, self._config.max_latency)
        logger.info("worker %s serving %s: %s", self.consumer, self._keys.requests, line)
        self._serving = True
        self._stats.watch(self)
        try:
            self._serve(self.model_predict)
        finally:
            self._serving = False
            self._stats.unwatch(self)
            self._stopping.set()  # ends the reader and the heartbeat, and bounds the writer's retries
            with self._cond:
                self._cond.notify_all()
            threads["reader"].join()
            writer.finish()  # the writer answers what is in hand, then ends
            threads["writer"].join()
            presence.leave(self._conn)
            self._conn.close()
            self._main_conn.close()
        logger.info("worker %s stopped", self.consumer)

    def model_predict(self, batch_input: List[Any]) -> Sequence[Any]:
        """Run the loaded model on one batch of inputs; return one output per input.

        Every batch goes through this method, as in service_streamer's
        ``RedisWorker``, so a subclass may override it to work on a batch
        in the worker (before or after the model) and call
        ``super().model_predict(...)``. The model is loaded by
        :meth:`run_forever`; before that this raises ``RuntimeError``.
        """
        predict = self._predict
        if predict is None:
            raise RuntimeError("the model is not loaded yet: run_forever() loads it, then runs batches here")
        return predict(batch_input)

    def _load_model(self, gpu_id: Optional[DeviceId]) -> Any:
        try:
            return load_predict(self._model_class, gpu_id, self._init_args, self._init_kwargs)
        except Exception as exc:
            failure = load_failure(exc, self._config.oom_errors, gpu_id)
            if failure is not exc:
                raise failure from exc
            raise WorkerStartError(f"could not load {callable_name(self._model_class)}: {exc!r}") from exc

    # the main thread: take a batch when the model is free, run it

    def _serve(self, predict: Any) -> None:
        while True:
            batch, alone = self._take()
            if batch is None:
                return
            answered, seconds = self._run(predict, batch)
            self._watch.answered = self._watch.answered or seconds > 0
            with self._cond:
                self._running, self._running_size = False, 0
                if alone:
                    self._orphan_in_hand = False
                if seconds:
                    # Counted now, before the next batch is chosen: the callers
                    # just answered come back within moments (their answers
                    # are written next), and are worth waiting for.
                    self._policy.delivered(answered, seconds, time.monotonic())
                    self._delivered_at_ms = self._clock.now_ms(refresh=False)
                self._cond.notify_all()

    def _take(self) -> Tuple[Optional[List[Input]], bool]:
        """Wait until the batch read so far should run, by the in-process
        rule (full, or its oldest input waited ``max_latency``, or no caller
        just answered is still expected back), and take it. ``(None, False)``
        once stopping and nothing is left."""
        size = self._config.batch_size
        with self._cond:
            while True:
                if self._next:
                    now = time.monotonic()
                    go = (
                        self._next_alone
                        or len(self._next) >= size
                        or self._stopping.is_set()
                        or self._reader_done
                        or (self._shaping and self._over_budget())
                    )
                    hold_until = now if go else self._policy.hold_until(self._next_first_seen, now)
                    if now >= hold_until:
                        batch, alone = self._next, self._next_alone
                        self._next, self._next_alone = [], False
                        if self._shaping and not alone:
                            batch, self._next = self._shape(batch)
                        self._running, self._running_size = True, len(batch)
                        self._cond.notify_all()  # the reader may fill the next one
                        return batch, alone
                    self._cond.wait(hold_until - now)
                elif self._reader_done:
                    return None, False
                else:
                    self._cond.wait()

    def _over_budget(self) -> bool:
        """Whether what was read is more than one batch's budget."""
        return self._shaper.over_budget([held.cost for held in self._next])

    def _shape(self, held: List[Input]) -> Tuple[List[Input], List[Input]]:
        """The batch to run out of what was read (the oldest, then those
        closest to it in cost, within the budget), and what is left for the
        next one: still pending under this worker, within one batch."""
        taken = self._shaper.shape([h.cost for h in held])
        chosen = set(taken)
        return [held[i] for i in taken], [h for i, h in enumerate(held) if i not in chosen]

    def _run(self, predict: Any, batch: List[Input]) -> Tuple[int, float]:
        """Run ``batch`` and queue its answers for the writer; return how
        many callers it answers and the model's seconds (0 if it did not run)."""
        outcomes: List[Outcome] = [None] * len(batch)
        inputs, positions = [], []
        now_ms = self._clock.now_ms(refresh=False)
        withdrawn = self._withdrawn(batch)
        for position, held in enumerate(batch):
            request = held.request
            if request.entry_id in withdrawn or now_ms > request.created_ms() + request.timeout_ms:
                continue  # its caller has given up while it waited here: not run, not answered
            if held.error is not None:
                outcomes[position] = (False, held.error)
            else:
                inputs.append(held.value)
                positions.append(position)
        started = time.monotonic()
        if inputs:
            config = self._config
            waits_ms = max(batch[p].request.created_ms() + batch[p].request.timeout_ms - now_ms for p in positions)
            self._watch.started(started, started + waits_ms / 1000)
            try:
                run = run_batch(predict, inputs, config.isolate_errors, config.oom_errors)
            finally:
                self._watch.ended()
            for position, outcome in zip(positions, run.outcomes):
                outcomes[position] = outcome
            if run.oom_splits:
                self._stats.oom_split(run.oom_splits)
            with self._cond:
                self._shaper.learn([batch[p].cost for p in positions], run.out_of_memory, run.ran)
                self._shaping = self._shaper.active
        seconds = time.monotonic() - started if inputs else 0.0
        if inputs:
            # Each request's wait, by the server's clock: from its entry's time to now.
            arrivals = [started - max(0.0, now_ms - batch[p].request.created_ms()) / 1000 for p in positions]
            self._stats.batch_ran(started, seconds, arrivals)
        assert self._writer is not None  # made by run_forever
        self._writer.put([held.request for held in batch], outcomes)
        return sum(outcome is not None for outcome in outcomes), seconds

    def _withdrawn(self, batch: List[Input]) -> Set[bytes]:
        """The requests of ``batch`` whose callers gave up since they were
        read (their web process deleted them from the stream). Claiming the
        batch again tells: Redis 7 skips deleted entries (and drops them from
        the pending list). Asked only when a request of the batch has waited
        here ``_RECHECK_AFTER_S`` or more (read ahead while the model ran,
        or held for companions). On older servers, or when Redis does not
        answer, nothing counts as withdrawn: such a request runs, and its
        answer is dropped by its web process."""
        if time.monotonic() - min((held.read_at for held in batch), default=0.0) < _RECHECK_AFTER_S:
            return set()
        ids = [held.request.entry_id for held in batch]
        try:
            kept = self._main_conn.xclaim(self._keys.requests, GROUP, self.consumer, 0, ids, justid=True)
        except Exception as exc:
            logger.debug("could not re-claim a batch before running it: %s", exc)
            return set()
        return set(ids).difference(kept)

    # the reader thread

    def _read(self) -> None:
        """Fill the next batch while the model runs: at most
        :meth:`_read_ahead` requests beyond the running batch, or one request
        taken over from a dead worker, to run alone."""
        import redis

        intake = self._intake
        assert intake is not None  # made by run_forever
        failing_since: Optional[float] = None
        errors = LoopErrors("the Redis worker's reader")
        try:
            while not self._stopping.is_set():
                with self._cond:
                    while (len(self._next) >= self._read_ahead() or self._next_alone) and not self._stopping.is_set():
                        self._cond.wait()
                    if self._stopping.is_set():
                        return
                    room, empty, busy = self._read_ahead() - len(self._next), not self._next, self._running
                    now = time.monotonic()
                    hold_left = None if empty or busy else self._policy.hold_until(self._next_first_seen, now) - now
                try:
                    intake.ensure_group()
                    if empty and not self._orphan_in_hand:
                        orphan = intake.claim_orphan(self._refuse)
                        if orphan is not None:
                            self._add([orphan], alone=True)
                            continue
                    block = self._may_read(busy, room, hold_left)
                    if block is False:
                        continue
                    reply = self._conn.xreadgroup(
                        GROUP, self.consumer, {self._keys.requests: ">"}, count=room, block=block
                    )
                    if failing_since is not None:
                        logger.warning("Redis is reachable again")
                        failing_since = None
                    got = intake.accept(reply[0][1] if reply else [])
                    if got:
                        self._add(got)
                    elif block is None and not busy:  # holding: look again shortly, or once the batch is taken
                        with self._cond:
                            if self._next and not self._running:
                                self._cond.wait(_HOLD_POLL_S)
                except broker_errors() as exc:
                    if failing_since is None:
                        failing_since = time.monotonic()
                        logger.warning("lost Redis: %s; retrying", broker_problem(exc, self._address))
                    intake.group_lost()
                    self._stopping.wait(min(MAX_BACKOFF_S, 0.05 + (time.monotonic() - failing_since) / 4))
                except redis.ResponseError as exc:
                    intake.group_lost()
                    if "NOGROUP" in str(exc):
                        logger.warning("the consumer group is gone (the Redis server restarted empty); recreating it")
                    elif is_wrong_type(exc):
                        repair_key(self._conn, self._keys.requests, "stream")
                    else:
                        errors.log(exc)
                        self._stopping.wait(0.1)
                except Exception as exc:  # never let the reader die: the worker would serve nothing
                    errors.log(exc)
                    self._stopping.wait(0.1)
        finally:
            with self._cond:
                self._reader_done = True
                self._cond.notify_all()

    def _read_ahead(self) -> int:
        """How many requests to hold besides the running batch: a full batch;
        for the only worker alive shaping by cost, what two full batches
        would be, less the running one. Its shaped batches are usually far
        smaller than ``batch_size``, and the more it holds the more alike
        the inputs it can put together; no other worker waits for them. A
        SIGKILL still loses nothing: all of it is pending under its name."""
        size = self._config.batch_size
        if self._shaping and self._sole_worker():
            return 2 * size - self._running_size
        return size

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
            with self._cond:
                if self._running:
                    self._cond.wait(self._poll_s())
            return False
        if hold_left is None:
            return _BLOCK_MS
        if hold_left > 0:
            return None
        with self._cond:  # the batch goes now: let the model take it first
            if self._next and not self._running:
                self._cond.wait(_HOLD_POLL_S)
        return False

    def _backlog(self) -> int:
        """Requests in the stream that no worker has taken yet, about: the
        entries, less those delivered and not yet acknowledged (each answered
        request is deleted when acknowledged)."""
        pipe = self._conn.pipeline(transaction=False)
        pipe.xlen(self._keys.requests)
        pipe.xpending(self._keys.requests, GROUP)
        length, pending = pipe.execute()
        return int(length) - int(pending.get("pending") or 0)

    def _poll_s(self) -> float:
        """How often a busy worker looks for a full batch waiting: an eighth
        of a batch's time, within 1 to 10 ms."""
        service = self._policy.service
        return 0.002 if service is None else min(0.01, max(0.001, service / 8))

    def _add(self, inputs: List[Input], alone: bool = False) -> None:
        now = time.monotonic()
        with self._cond:
            if not self._next:
                self._next_first_seen = now
            self._next.extend(inputs)
            if alone:
                self._next_alone = self._orphan_in_hand = True
            else:
                # Only requests added to the stream since the last answers
                # were given count as those callers coming back: others were
                # already waiting (read late, as a busy worker reads only
                # full batches).
                since = self._delivered_at_ms
                returned = sum(held.request.created_ms() >= since for held in inputs)
                if returned:
                    self._policy.arrived(returned, now)
            self._cond.notify_all()

    def _refuse(self, held: Input, error: BaseException) -> None:
        """Answer a request with ``error`` without running it."""
        assert self._writer is not None  # made by run_forever
        self._writer.put([held.request], [(False, error)])

    def _sole_worker(self) -> bool:
        """Whether no other worker is alive (by the last heartbeat)."""
        presence = self._presence
        return presence is not None and presence.sole_worker

    def _check_setup(self) -> None:
        """Raise ``ValueError`` when Redis refuses this worker's connection
        set-up (a database number it does not have): its loops would retry
        that for good. A Redis that does not answer yet is waited for."""
        import redis

        conn = connect(self._address)
        try:
            conn.ping()
        except broker_errors():
            pass
        except redis.ResponseError as exc:
            raise setup_refused(self._address, exc) from exc
        finally:
            conn.close()
