"""The web side of the Redis backend: :class:`RedisStreamer`, whose calls
its :class:`~.client.RedisClientBackend` queues in Redis for workers
that run elsewhere."""

from __future__ import annotations

import functools
from typing import Any, Callable, List, Optional, Sequence, cast

from ...errors import BrokerUnavailableError
from ...options.config import OPTIONS, BatchingConfig, default
from ...options.redis_address import DEFAULT_REDIS, AddressLike, RedisAddress
from ...streamer import BaseStreamer
from .client import RedisClientBackend
from .connection import broker_errors, broker_problem

__all__ = ["RedisStreamer"]

# The most items a web process sends to Redis at once (one script call, or
# one pipeline for requests carrying large arrays).
_SEND_BATCH = 256
# The longest a web process holds a request to send it with others (seconds):
# only while callers it has just answered are due back, by the in-process
# rule (HoldPolicy). One send instead of a send per returning caller
# costs the callers nothing (the worker waits for them as well), and saves
# the web process the CPU and the GIL that the other sends would take while
# its callers come back.
_SEND_HOLD_S = 0.01


class RedisStreamer(BaseStreamer):
    """The web side of the Redis backend: queue inputs for workers that run
    elsewhere (:class:`RedisWorker`, ``run_redis_workers_forever`` or the
    ``streamer-worker`` command) and wait for their answers.

    ``redis_broker`` is ``"host:port"``, a ``redis://`` / ``rediss://`` /
    ``unix://`` URL, a ``redis+sentinel://`` or ``redis+cluster://`` URL
    (see :mod:`streamer_core.options.redis_address`), or a :class:`RedisAddress`;
    ``prefix`` keeps models apart on one Redis (workers use the same one).
    Keyword-only: ``timeout`` (seconds a call may take, default 20),
    ``max_queue`` (the most inputs of this web process waiting for an answer,
    sent or not; past it calls fail at once with ``QueueFullError``), and
    ``codec`` (``"msgpack"``, the default, or ``"pickle"``, which the workers
    must be started with too), and ``require_workers`` (default False: calls
    wait in Redis for a worker to come; True: while no worker has been alive
    for a few seconds, calls fail at once with :class:`NoWorkerError`, as a
    web service wants), and ``item_cost`` (a function of one input giving its
    cost: computed here, it travels with the request to workers started with
    a ``max_batch_cost``), ``name`` (this model's name in :meth:`stats`
    and the metrics, default ``prefix``), and ``tracing`` (each call's span
    context goes with its inputs to workers that trace: :mod:`streamer_core.telemetry.tracing`),
    and the priority options of every streamer (``priority_levels``,
    ``default_priority``, ``priority_max_queue``, ``priority_timeout``): a
    call's ``priority`` chooses the stream its inputs go to, one per level,
    which workers started with as many ``priority_levels`` read highest
    first (see :mod:`.roster` for workers that read fewer). A web process
    sends no more than its live workers take in two batches each, out
    unanswered; what waits beyond that waits here, where an overload
    (``overload_after``, ``overload_wait``: :mod:`streamer_core.batching.overload`)
    is served newest first, its longest waiting refused.
    Same signature as service_streamer's ``RedisStreamer``.
    """

    def __init__(
        self,
        redis_broker: AddressLike = DEFAULT_REDIS,
        prefix: str = "",
        *,
        timeout: float = default("timeout"),
        max_queue: Optional[int] = default("max_queue"),
        codec: str = default("codec"),
        require_workers: bool = False,
        item_cost: Optional[Callable[[Any], float]] = None,
        name: Optional[str] = None,
        tracing: bool = default("tracing"),
        priority_levels: int = default("priority_levels"),
        default_priority: Optional[int] = default("default_priority"),
        priority_max_queue: Optional[Sequence[Optional[int]]] = default("priority_max_queue"),
        priority_timeout: Optional[Sequence[Optional[float]]] = default("priority_timeout"),
        overload_after: Optional[float] = default("overload_after"),
        overload_wait: float = default("overload_wait"),
    ) -> None:
        # Batches here are sends to Redis, the highest level's first; workers
        # form the model's, costs sent along (see encode).
        config = BatchingConfig(
            _SEND_BATCH,
            _SEND_HOLD_S,
            timeout,
            max_queue,
            tracing=tracing,
            priority_levels=priority_levels,
            default_priority=default_priority,
            priority_max_queue=priority_max_queue,
            priority_timeout=priority_timeout,
            overload_after=overload_after,
            overload_wait=overload_wait,
        )
        if not isinstance(require_workers, bool):
            raise TypeError(f"require_workers must be True or False, got {require_workers!r}")
        item_cost = OPTIONS["item_cost"].checked(item_cost)
        address = RedisAddress.of(redis_broker)
        hold_back = config.overload_after is not None  # the overload rule sees what waits here, not in Redis
        backend = functools.partial(
            RedisClientBackend, address, prefix, codec, require_workers, item_cost, config.priority_levels, hold_back
        )
        super().__init__(config, backend, name=(prefix or "redis") if name is None else name)

    @property
    def _backend(self) -> RedisClientBackend:
        return cast(RedisClientBackend, self._engine.backend)

    def _admit(self, inputs: List[Any], level: int = 0) -> None:
        backend, config = self._backend, self._config
        roster = backend.roster
        if backend.missing_workers():
            raise roster.error()
        leveled = config.priority_levels > 1
        unread = roster.unread(level) if leveled else None
        if unread is not None:
            raise unread
        limit = config.queue_limit(level)
        if limit is not None:
            queued = self._engine.scheduler.queued_by_level()[level] if leveled else self.queued()
            self._backend.ledger.make_room(len(inputs), queued, limit, level if leveled else None)

    def live_workers(self) -> int:
        """How many workers serve this prefix right now (a health check);
        raises :class:`BrokerUnavailableError` when Redis cannot be reached."""
        try:
            return self._backend.live_workers()
        except broker_errors() as exc:
            raise BrokerUnavailableError(broker_problem(exc, self._backend._address)) from exc

    def why_not_ready(self) -> Optional[str]:
        if self.closed:
            return "the streamer is closed"
        try:
            return self._backend.why_not_ready()
        except broker_errors() as exc:
            return str(BrokerUnavailableError(broker_problem(exc, self._backend._address)))

    why_not_ready.__doc__ = BaseStreamer.why_not_ready.__doc__

    def wait_ready(self, timeout: float = 60.0) -> bool:
        """Wait until at least one worker serves this prefix (workers load
        their model before they announce themselves); return whether one
        did within ``timeout`` seconds."""
        return self._backend.wait_ready(timeout)
