"""Every option of the streamers, their workers and the web layers: its
default, its unit and its check, in one table (:data:`OPTIONS`).

Nothing else writes a default or checks a value. :class:`BatchingConfig`
(how requests become batches) is made of the table's batching options; the
streamers' constructors take their defaults from it; the Flask and Django
settings, the worker commands and their ``--help`` are derived from it
(:mod:`streamer_core.web.spec`). Each check says what is wrong after the
name, and the caller puts in front the name as the user wrote it::

    OPTIONS["batch_size"].checked(0)                          # batch_size must be a whole number >= 1, got 0
    OPTIONS["batch_size"].checked(0, "STREAMER_BATCH_SIZE")   # STREAMER_BATCH_SIZE must be ...

so a wrong value fails where it was given, with one message whatever the
way in, at construction or at start-up, never at the first request.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, Callable, Dict, Mapping, NamedTuple, Optional, Sequence, Tuple, Type, TypedDict

from .checks import (
    MAX_SECONDS,
    Check,
    arguments,
    body_bytes,
    budget,
    check_cost,
    check_oom_errors,
    check_seconds,
    checked,
    flag,
    header_name,
    keywords,
    one_of,
    optional_flag,
    per_level,
    seconds,
    text,
    whole,
)
from .devices import DeviceId, devices_checked, parse_devices, shown_device
from .redis_address import ADDRESS_FORMS, RedisAddress

__all__ = [
    "BatchingConfig",
    "BatchingOptions",
    "ModelOptions",
    "Option",
    "OPTIONS",
    "DeviceId",
    "shown_device",
    "default",
    "MAX_SECONDS",
    "BACKENDS",
    "CODECS",
    "parse_devices",
    "checked",
    "check_cost",
    "check_seconds",
]

#: How a batch's cost follows from its inputs' costs (``batch_cost``).
BATCH_COST_RULES = ("max", "sum")
#: The backends a web layer's settings may name.
BACKENDS = ("thread", "process", "redis")
#: The wire formats of the Redis backend.
CODECS = ("msgpack", "pickle")


class Option(NamedTuple):
    """One option: its ``default``, and ``check``, which returns the value
    as kept (``"0,1"`` as ``(0, 1)``, an import path as what it names) or
    raises ``TypeError``/``ValueError`` saying what is wrong, without the
    name: :meth:`checked` puts it in front. ``kind`` groups options for the
    web layers' error codes (``size``, ``seconds``, ``devices``,
    ``backend``, ``redis_url``, ``option``); ``help`` is one line with the
    unit, for the documentation and the commands' ``--help``."""

    name: str
    default: Any
    check: Check
    kind: str
    help: str

    def checked(self, value: Any, written_as: Optional[str] = None) -> Any:
        """``value``, checked and as kept; raises ``TypeError`` or
        ``ValueError`` naming the option as ``written_as`` (default its name)."""
        return checked(written_as or self.name, self.check, value)


# -- the checks ----------------------------------------------------------------


def _tracing(value: Any) -> bool:
    """``tracing``: a flag; on, only where OpenTelemetry's API is installed
    (checked by finding the package: nothing of it is imported here)."""
    on = flag(value)
    if on:
        from ..telemetry.tracing import missing_api

        problem = missing_api()
        if problem is not None:
            raise ValueError(f"is True, but {problem}")
    return on


def _backend(value: Any) -> str:
    if value not in BACKENDS:
        raise ValueError(f"is {value!r}; use one of {', '.join(map(repr, BACKENDS))}")
    return str(value)


def priority_problem(values: Mapping[str, Any], written_as: Callable[[str], str] = str) -> Optional[str]:
    """What is wrong between the priority options of ``values`` (each
    checked alone already, a missing one at its default), or ``None``:
    ``default_priority`` must be a level, and each per-level list must have
    one entry per level."""
    levels = values.get("priority_levels", 1)
    chosen = values.get("default_priority")
    if chosen is not None and chosen > levels:
        name, count = written_as("default_priority"), written_as("priority_levels")
        return f"{name} is {chosen}, but {count} is {levels}: the levels are 1 (highest) to {levels}"
    for option in ("priority_max_queue", "priority_timeout"):
        listed = values.get(option)
        if listed is not None and len(listed) != levels:
            return (
                f"{written_as(option)} has {len(listed)} entries, but {written_as('priority_levels')} is {levels}: "
                "give one per level, the highest (1) first"
            )
    return None


def _function(value: Any) -> Optional[Callable[[Any], float]]:
    """``item_cost``: a function of one input, or its import path (``"myapp.ml:tokens"``)."""
    if value is None:
        return None
    cost = value
    if isinstance(value, str):
        from ..importing import import_target

        try:
            cost = import_target(value)
        except ValueError as exc:
            raise ValueError(f"is {value!r}, which does not import: {exc}") from None
    if not callable(cost):
        raise TypeError(f"must be a function of one input returning a positive number, got {cost!r}")
    function: Callable[[Any], float] = cost
    return function


def _redis_url(value: Any) -> Optional[RedisAddress]:
    """A Redis address (:mod:`streamer_core.options.redis_address`), parsed; ``None``: not set."""
    if value is None:
        return None
    if not isinstance(value, (str, RedisAddress)):
        raise ValueError(f"must be {ADDRESS_FORMS}, got {value!r}")
    return RedisAddress.of(value)


# -- the table -------------------------------------------------------------------

_TABLE = (
    # How requests become batches: BatchingConfig's fields, in order.
    Option("batch_size", 64, whole(1), "size", "the most inputs one model call receives"),
    Option(
        "max_latency",
        0.1,
        seconds(allow_zero=True),
        "seconds",
        "seconds the oldest queued input may wait for companions, counted from its arrival",
    ),
    Option("timeout", 20.0, seconds(), "seconds", "seconds a call may take in all; then StreamerTimeoutError (504)"),
    Option(
        "max_queue",
        None,
        whole(1, optional=True),
        "size",
        "the most inputs waiting; past it a call fails at once with QueueFullError (503). None: no limit",
    ),
    Option(
        "isolate_errors",
        True,
        flag,
        "option",
        "when the model raises on a batch, re-run halves of it so only the failing inputs get the error",
    ),
    Option(
        "item_cost",
        None,
        _function,
        "option",
        "a function of one input (or its import path) giving its cost, e.g. its tokens; batches group like costs",
    ),
    Option(
        "max_batch_cost",
        None,
        budget,
        "option",
        "the most one batch may cost, in item_cost's units (each input costs 1 without it). None: no limit",
    ),
    Option(
        "batch_cost",
        "max",
        one_of(
            BATCH_COST_RULES,
            "must be 'max' (length times the costliest input: a padding model) or 'sum' (the inputs' costs added)",
        ),
        "option",
        "a batch's cost: 'max', its length times its costliest input (a padding model), or 'sum'",
    ),
    Option(
        "oom_errors",
        None,
        check_oom_errors,
        "option",
        "the exception types that mean out of memory; None: torch's, once torch is loaded",
    ),
    Option(
        "tracing",
        False,
        _tracing,
        "option",
        "OpenTelemetry spans of each request and batch, to the tracer provider set up (needs streamer-core[otel])",
    ),
    Option(
        "priority_levels",
        1,
        whole(1),
        "size",
        "how many priority levels calls may name, 1 the highest; 1: priorities off",
    ),
    Option(
        "default_priority",
        None,
        whole(1, optional=True),
        "size",
        "the level of a call that names none (1 the highest); None: the lowest, priority_levels",
    ),
    Option(
        "priority_aging",
        None,
        seconds(optional=True),
        "seconds",
        "seconds after which a waiting input is served as one level higher, each time again; None: never",
    ),
    Option(
        "overload_after",
        0.5,
        seconds(optional=True),
        "seconds",
        "seconds of batches each leaving inputs behind after which the queue stands: the newest inputs go first, "
        "and those that waited past overload_wait are refused (503); None: never",
    ),
    Option(
        "overload_wait",
        2.0,
        seconds(),
        "seconds",
        "while the queue stands, the longest an input waits (at least twice the model's batch time) before its "
        "call is refused with OverloadedError (503, Retry-After)",
    ),
    Option(
        "priority_max_queue",
        None,
        per_level(whole(1, optional=True), "a whole number >= 1 or None"),
        "option",
        "one bound per level (1 first) on its waiting inputs, each a number or None; None: max_queue for each",
    ),
    Option(
        "priority_timeout",
        None,
        per_level(seconds(optional=True), "seconds or None"),
        "option",
        "one default timeout per level (1 first), seconds or None (then timeout); None: timeout for each",
    ),
    # Where the model runs.
    Option("backend", "thread", _backend, "backend", "where the model runs: 'thread', 'process' or 'redis'"),
    Option("worker_num", 1, whole(1), "size", "worker processes per model (process and redis backends)"),
    Option(
        "model_threads",
        1,
        whole(1),
        "size",
        "batches the model runs at once on the thread backend, each on a thread of its own, one copy of the model "
        "shared: for a model safe to call from several threads (PyTorch's inference is)",
    ),
    Option(
        "cuda_devices",
        None,
        devices_checked,
        "devices",
        "CUDA devices, e.g. [0, 1] or '0,1': worker i gets devices[i % n]. None: leave CUDA_VISIBLE_DEVICES alone",
    ),
    Option(
        "max_item_crashes",
        2,
        whole(1),
        "size",
        "an input in this many batches whose worker died fails with WorkerDiedError instead of being run again",
    ),
    Option(
        "hang_timeout",
        60.0,
        seconds(optional=True),
        "seconds",
        "seconds a worker may run one batch nobody waits for any more before it is taken for hung. None: never",
    ),
    Option(
        "shared_memory_min_bytes",
        8 * 1024,
        whole(1, optional=True, unit=" of bytes"),
        "size",
        "arrays of at least this many bytes cross to and from worker processes through shared memory",
    ),
    Option(
        "claim_after",
        2.0,
        seconds(),
        "seconds",
        "seconds a Redis request may go without its worker's heartbeat before another worker takes it over",
    ),
    Option(
        "redis_url",
        None,
        _redis_url,
        "redis_url",
        "the Redis server, e.g. 'redis://127.0.0.1:6379/0'; its Sentinels, "
        "'redis+sentinel://host:26379,host:26380/mymaster/0'; or a Cluster, 'redis+cluster://host:7000,host:7001'",
    ),
    Option("prefix", "", text, "option", "names the model's Redis keys: web processes and workers agree on it"),
    Option(
        "codec",
        "msgpack",
        one_of(CODECS, "must be 'msgpack' or 'pickle' (pickle only with a trusted broker)"),
        "option",
        "the Redis wire format: 'msgpack', or 'pickle' only with a trusted broker",
    ),
    Option("init_args", (), arguments, "option", "positional arguments for the model's init_model"),
    Option("init_kwargs", {}, keywords, "option", "keyword arguments for the model's init_model"),
    # What a web layer reads of a request, and how it answers.
    Option(
        "json_errors",
        False,
        flag,
        "option",
        "answer every HTTP error of the app (404, 405, 413, ...) as JSON, as the batched routes answer theirs",
    ),
    Option(
        "timeout_header",
        "X-Request-Timeout",
        header_name,
        "option",
        "the request header in which a client says how many seconds it will still wait (never more than the "
        "timeout); None: read none",
    ),
    Option(
        "envoy_timeout",
        False,
        flag,
        "option",
        "also read Envoy's x-envoy-expected-rq-timeout-ms (milliseconds) as the client's deadline",
    ),
    Option(
        "error_details",
        None,
        optional_flag,
        "option",
        "say a 500's exception type and message to the client; None: only in debug mode (Flask's app.debug, "
        "Django's DEBUG); otherwise the client gets 'internal error' and an id the log line carries",
    ),
    Option(
        "shortcuts",
        True,
        flag,
        "option",
        "serve with less where an installed Flask, werkzeug, gevent, gunicorn or Django is a release the project "
        "tests its shortcuts through their private workings on; False: their public paths only",
    ),
    Option(
        "max_body_bytes",
        10 * 1024 * 1024,
        body_bytes,
        "option",
        "the largest request body a batched endpoint reads (10 MiB); a larger one gets 413. None: no limit",
    ),
    Option(
        "max_inputs",
        2048,
        whole(1),
        "size",
        "the most inputs one request to an endpoint that takes many (many=True) may carry; more gets 413",
    ),
)

#: Every option by name.
OPTIONS: Dict[str, Option] = {option.name: option for option in _TABLE}


def default(name: str) -> Any:
    """The default of the option ``name``."""
    return OPTIONS[name].default


class ModelOptions(TypedDict, total=False):
    """The keyword options of the model's side of a streamer (see :data:`OPTIONS`)."""

    isolate_errors: bool
    item_cost: Optional[Callable[[Any], float]]
    max_batch_cost: Optional[float]
    batch_cost: str
    oom_errors: Optional[Tuple[Type[BaseException], ...]]
    tracing: bool
    priority_levels: int
    priority_aging: Optional[float]


class BatchingOptions(ModelOptions, total=False):
    """Every keyword option of :class:`BatchingConfig`: the model's side and the callers'."""

    timeout: float
    max_queue: Optional[int]
    default_priority: Optional[int]
    priority_max_queue: Optional[Sequence[Optional[int]]]
    priority_timeout: Optional[Sequence[Optional[float]]]
    overload_after: Optional[float]
    overload_wait: float


@dataclass(frozen=True)
class BatchingConfig:
    """How requests are grouped into batches and how long a call may take;
    each field is the option of the same name in :data:`OPTIONS`, checked
    when the config is made.

    batch_size
        The most items one model call receives.
    max_latency
        Seconds the oldest queued item may wait for companions, counted from
        its arrival. A lone request does not wait at all when no companions
        are arriving (see :mod:`streamer_core.batching.hold`).
    timeout
        Seconds a call may take in all (queue, model, delivery) unless the
        call passes its own; then it fails with ``StreamerTimeoutError``.
    max_queue
        The most items waiting for the model; past it a call fails at once
        with ``QueueFullError``. ``None``: no limit.
    isolate_errors
        When the model raises on a batch, re-run halves of it to find the
        items that fail, so only their callers get the exception.
    item_cost
        A function of one input returning its cost, a positive number (a
        text's token count, an image's pixels), or its import path. When
        set, a batch starts with the oldest waiting input and fills with the
        waiting inputs closest to it in cost, so that inputs of like cost
        run together. It runs in the caller's thread, before the input is
        queued.
    max_batch_cost
        The most one batch may cost; ``None``: no limit but ``batch_size``.
        An input whose own cost is over it runs alone. Without ``item_cost``
        each input costs 1.
    batch_cost
        How a batch's cost follows from its inputs': ``"max"`` (its length
        times its costliest input: what a model that pads its batch pays) or
        ``"sum"`` (for a model that does not pad).
    oom_errors
        The exception types that mean the model ran out of memory: a batch
        raising one is split and its halves retried (even with
        ``isolate_errors`` off), and later batches are capped at the cost of
        what ran (see :mod:`streamer_core.batching.shaping`). ``None``: torch's
        ``torch.cuda.OutOfMemoryError`` when torch is loaded; ``()``: none.
    tracing
        Make OpenTelemetry spans of each request and batch
        (:mod:`streamer_core.telemetry.tracing`), through the tracer provider the
        process has set up. Off, the engine never imports OpenTelemetry and
        pays one flag test a call and a batch.
    priority_levels, default_priority, priority_aging, priority_max_queue, priority_timeout
        Priority levels: see :mod:`streamer_core.batching.levels`. A call names its
        level as ``priority``, 1 the highest (as Triton numbers them).
    overload_after, overload_wait
        Overload: once every batch for ``overload_after`` seconds has left
        inputs behind, the newest inputs go first and one that waited
        longer than ``overload_wait`` is refused with ``OverloadedError``
        (see :mod:`streamer_core.batching.overload`). ``overload_after=None``: never.
    """

    batch_size: int = default("batch_size")
    max_latency: float = default("max_latency")
    timeout: float = default("timeout")
    max_queue: Optional[int] = default("max_queue")
    isolate_errors: bool = default("isolate_errors")
    item_cost: Optional[Callable[[Any], float]] = default("item_cost")
    max_batch_cost: Optional[float] = default("max_batch_cost")
    batch_cost: str = default("batch_cost")
    oom_errors: Optional[Tuple[Type[BaseException], ...]] = default("oom_errors")
    tracing: bool = default("tracing")
    priority_levels: int = default("priority_levels")
    default_priority: Optional[int] = default("default_priority")
    priority_aging: Optional[float] = default("priority_aging")
    priority_max_queue: Optional[Sequence[Optional[int]]] = default("priority_max_queue")
    priority_timeout: Optional[Sequence[Optional[float]]] = default("priority_timeout")
    overload_after: Optional[float] = default("overload_after")
    overload_wait: float = default("overload_wait")

    def __post_init__(self) -> None:
        for field in fields(self):
            object.__setattr__(self, field.name, OPTIONS[field.name].checked(getattr(self, field.name)))
        problem = priority_problem({field.name: getattr(self, field.name) for field in fields(self)})
        if problem is not None:
            raise ValueError(problem)

    @classmethod
    def of_checked(cls, values: Mapping[str, Any]) -> BatchingConfig:
        """The config of ``values`` (by field; a missing one takes its
        default) that were each checked by its option already, as a web
        layer's settings are, each under the name it was written by: they
        are not checked again."""
        config = object.__new__(cls)
        for field in fields(cls):
            object.__setattr__(config, field.name, values.get(field.name, OPTIONS[field.name].default))
        return config  # the priority options checked together too, by the caller (priority_problem)

    @property
    def shapes_by_cost(self) -> bool:
        """Whether batches are shaped by cost at all (else: first in, first out, by count)."""
        return self.item_cost is not None or self.max_batch_cost is not None

    def model_options(self) -> ModelOptions:
        """The options of the model's side, to make a Redis worker of this
        config: with its priority levels, the streams it reads, and their aging."""
        return ModelOptions(
            isolate_errors=self.isolate_errors,
            item_cost=self.item_cost,
            max_batch_cost=self.max_batch_cost,
            batch_cost=self.batch_cost,
            oom_errors=self.oom_errors,
            tracing=self.tracing,
            priority_levels=self.priority_levels,
            priority_aging=self.priority_aging,
        )

    def level_of(self, priority: Optional[int]) -> int:
        """The level (0 the highest) of a call naming ``priority`` (1 the
        highest; ``None``: ``default_priority``, else the lowest); raises
        ``TypeError``/``ValueError`` for one that is not a level."""
        levels = self.priority_levels
        if priority is None:
            return (levels if self.default_priority is None else self.default_priority) - 1
        if isinstance(priority, bool) or not isinstance(priority, int) or not 1 <= priority <= levels:
            raise (TypeError if isinstance(priority, bool) or not isinstance(priority, int) else ValueError)(
                f"priority must be a whole number from 1 (the highest) to {levels} (priority_levels), got {priority!r}"
            )
        return priority - 1

    def queue_limit(self, level: int) -> Optional[int]:
        """The most inputs waiting at ``level`` (0 the highest) before its calls get ``QueueFullError``."""
        limits = self.priority_max_queue
        return self.max_queue if limits is None else limits[level]

    def call_timeout(self, timeout: Optional[float], level: int = 0) -> float:
        """The timeout of one call at ``level``: its own, validated, or the configured one."""
        if timeout is None:
            timeouts = self.priority_timeout
            if timeouts is None or timeouts[level] is None:
                return self.timeout
            return float(timeouts[level])  # type: ignore[arg-type]  # checked just above
        if type(timeout) is float and 0.0 < timeout <= MAX_SECONDS:
            return timeout  # the common case, checked without a call
        return float(OPTIONS["timeout"].checked(timeout))
