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

This module holds the worker itself, which composes the threads: the main
thread's loop (what it does with a batch before and after the model) is
:mod:`.model_loop`'s, the reader's loop and what it hands the model's thread
(a batch former, as in-process) are :mod:`.reader`'s, its dealings with the
stream :mod:`.intake`'s, the writer is :mod:`.answers`, the heartbeat
:mod:`.presence`.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import threading
import uuid
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Sequence, Tuple

from ...batching.oom import load_failure
from ...codec import Codec, get_codec
from ...errors import WorkerStartError
from ...managed_model import check_model, freeze_loaded, load_predict, model_facts, ready_line
from ...options.config import OPTIONS, BatchingConfig, DeviceId, ModelOptions, default, shown_device
from ...options.redis_address import DEFAULT_REDIS, AddressLike, RedisAddress
from ...streamer import callable_name
from ...telemetry.stats import StreamerStats, stats_for
from ...telemetry.tracing import BatchFacts
from ...threads import background
from .answers import AnswerWriter
from .connection import (
    broker_errors,
    connect,
    refuses_setup,
    setup_refused,
)
from .intake import Hands, Intake, ServerClock
from .model_loop import ModelLoop
from .presence import Loading, ModelWatch, Presence
from .reader import Handover, Reader
from .wire import Keys

if TYPE_CHECKING:
    from typing_extensions import Unpack

__all__ = ["RedisWorker"]

logger = logging.getLogger("streamer_core.redis")


class RedisWorker:
    """A model worker for the Redis backend: takes batches of requests from
    the stream, runs them, and answers each web process.

    Same signature as service_streamer's ``RedisWorker``; ``model_class`` is a
    :class:`ManagedModel` subclass (built in :meth:`run_forever`) or a
    function taking a list; ``redis_broker`` is where Redis is, in any form
    of :mod:`streamer_core.options.redis_address` (one server, Sentinels, a
    Cluster), as the web side's. Keyword-only: ``codec`` (``"msgpack"``, or
    ``"pickle"`` to accept pickled inputs from a trusted broker),
    ``isolate_errors``, ``claim_after`` (seconds an entry may go without a
    heartbeat before another worker takes it over, default 2),
    ``max_item_crashes`` (default 2), and the options that shape batches by
    cost, as on every streamer (:class:`~streamer_core.BatchingConfig`):
    ``max_batch_cost``, ``batch_cost``, ``oom_errors``, and ``item_cost``,
    used for requests whose web side sent no cost of its own; ``name``, the
    model's name in :meth:`stats` and the metrics (default ``prefix``);
    ``tracing``: run each batch in an OpenTelemetry span linked to its
    callers' (:mod:`streamer_core.telemetry.tracing`; the process sets up its tracer
    provider, e.g. in the model's ``init_model``);
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
        if config.priority_levels > 1:
            self._stats.use_levels(config.priority_levels)
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
        # What the reader read while the model runs, and when and how it
        # becomes the next batch, by the in-process rule.
        self._handover = Handover(config)
        # While the model runs a batch: since when, and until when its last
        # caller waits; read by the heartbeat thread.
        self._watch = ModelWatch()
        # Made by run_forever, for the threads it starts.
        self._conn: Any = None  # the reader's
        self.consumer = ""
        self._serving = False
        self._device: Optional[str] = None  # CUDA_VISIBLE_DEVICES as it serves
        self._predict: Optional[Callable[[List[Any]], Sequence[Any]]] = None  # the model's, once loaded

    def stats(self) -> StreamerStats:
        """This worker process's numbers: its batches, their queue waits (from
        each request's arrival in Redis) and model seconds, the inputs it
        holds read ahead (``queue_depth``) and whether it serves
        (``workers_live``). Calls are counted by the web processes."""
        return self._stats.snapshot()

    def gauges(self) -> Tuple[int, int]:
        """``(inputs read ahead, 1 while serving)``, for the stats."""
        with self._handover.cond:
            return len(self._handover.former), int(self._serving)

    def levels_waiting(self) -> List[int]:
        """The inputs read ahead at each priority level, the highest first, for the stats."""
        leveled = self._handover.leveled
        if leveled is None:
            return []
        with self._handover.cond:
            return leveled.levels_waiting()

    def cost_cap(self) -> float:
        """The cap on a batch's cost learned from running out of memory
        (``inf``: none), for the stats."""
        return self._handover.former.shaper.cap.limit

    def devices(self) -> Dict[str, int]:
        """``{its device: 1 while serving}``, for the stats: the device as
        ``CUDA_VISIBLE_DEVICES`` names it (``default``: not set)."""
        return {shown_device(self._device): int(self._serving)}

    def stop(self) -> None:
        """Finish the batches in hand, then return from :meth:`run_forever`."""
        self._stopping.set()
        with self._handover.cond:
            self._handover.cond.notify_all()

    def run_forever(self, gpu_id: Optional[DeviceId] = None) -> None:
        """Load the model and serve until :meth:`stop` or SIGTERM, which lets
        the batches in hand (the one running and the one read ahead) finish
        first. Raises :class:`WorkerStartError` if the model cannot be loaded."""
        if gpu_id is not None:
            os.environ["CUDA_VISIBLE_DEVICES"] = str(gpu_id)
        self._check_setup()  # before the model loads: a wrong URL is told at once
        self.consumer = f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        device = os.environ.get("CUDA_VISIBLE_DEVICES")  # set above from gpu_id, or by whoever started us
        self._device = device
        # "levels": the priority levels it reads (a stream each), which web processes check their own against.
        levels = self._config.priority_levels
        # "batch_size": how much of a large call web processes let into the stream at once.
        about = {"host": socket.gethostname(), "pid": os.getpid(), "device": device, "levels": levels}
        about["batch_size"] = self._config.batch_size
        with Loading(self._address, self._keys, self.consumer, about):
            predict = self._predict = self._load_model(gpu_id)
        freeze_loaded()
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, lambda *_: self.stop())
        info = json.dumps(about)
        self._conn = connect(self._address)
        main_conn = connect(self._address)
        hands, clock = self._hands, ServerClock(self._conn, self._keys.requests)
        self._handover.clock = clock
        intake = Intake(
            self._conn,
            self.consumer,
            self._keys,
            self._codec,
            self._config.item_cost,
            hands,
            clock,
            self._claim_after,
            self._max_item_crashes,
            self._stats,
            levels,
        )
        writer = AnswerWriter(self._address, self._keys, self._codec, hands, clock, self._stopping)
        loop = ModelLoop(
            self._config,
            self._stats,
            self._handover,
            self._watch,
            clock,
            writer,
            main_conn,
            self._keys,
            self.consumer,
            self._stopping,
        )
        presence = Presence(
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
            levels,
        )
        reader = Reader(
            self._conn,
            self._address,
            self._keys,
            self.consumer,
            intake,
            self._handover,
            self._config,
            lambda: presence.sole_worker,
            loop.refuse,
            self._stopping,
        )
        # Live to the web side before the first request is read: a worker
        # that answered a call is counted (metrics, readiness) from then on.
        presence.beat(self._conn)
        threads = {
            name: background(target, f"streamer-redis-{name}")
            for name, target in (("heartbeat", presence.run), ("reader", reader.run), ("writer", writer.run))
        }
        for thread in threads.values():
            thread.start()
        facts = model_facts(predict, gpu_id)
        if self._config.tracing:
            loop.trace_facts = BatchFacts(self._stats.model, "redis", self.consumer, facts.device)
        line = ready_line(facts, self._config.batch_size, self._config.max_latency)
        served = self._keys.requests if levels == 1 else f"{self._keys.requests} and {levels - 1} lower level(s)"
        logger.info("worker %s serving %s: %s", self.consumer, served, line)
        self._serving = True
        self._stats.watch(self)
        try:
            loop.serve(self.model_predict)
        finally:
            self._serving = False
            self._stats.unwatch(self)
            self.stop()  # ends the reader and the heartbeat, and bounds the writer's retries
            threads["reader"].join()
            writer.finish()  # the writer answers what is in hand, then ends
            threads["writer"].join()
            presence.leave(self._conn)
            self._conn.close()
            main_conn.close()
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

    def _check_setup(self) -> None:
        """Raise ``ConfigurationError`` (a ``ValueError``) when Redis refuses
        this worker's connection set-up (a database number it does not have,
        its credentials): its loops would retry that for good. A Redis that
        does not answer yet is waited for."""
        conn = connect(self._address)
        try:
            conn.ping()
        except Exception as exc:
            if refuses_setup(exc):
                raise setup_refused(self._address, exc) from exc
            if not isinstance(exc, broker_errors()):
                raise
        finally:
            conn.close()
