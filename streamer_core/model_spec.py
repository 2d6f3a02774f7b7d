"""One batched model as a web framework's settings describe it.

The Flask extension (``app.config["STREAMER_*"]``) and the Django app
(``settings.STREAMER["MODELS"]``) both turn their settings into a
:class:`ModelSpec`: which backend, which model, and its batching options.
A spec is checked as a whole by :meth:`ModelSpec.problems`, which lists every
wrong value with the setting to change, so each framework can report them
its own way (an exception at ``init_app``, system checks under Django). It
then builds the streamer (:meth:`ModelSpec.build`) or the Redis workers
(:meth:`ModelSpec.worker_group`).

:class:`LazyStreamer` holds a spec's streamer in one web process: it is made
on first use, never at import, and made again in a forked child (gunicorn
forks its workers after importing the app with ``--preload``), because a
streamer's threads do not survive a fork.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, NamedTuple, Optional, Sequence, Tuple

from .config import (
    BATCH_COST_RULES,
    DEFAULT_MAX_LATENCY,
    DEFAULT_TIMEOUT,
    MAX_SECONDS,
    DeviceId,
    _check_int,
    _check_seconds,
    check_cost,
)
from .errors import StreamerError, WorkerStartError
from .managed_model import ManagedModel, load_predict
from .streamer import BaseStreamer, callable_name

__all__ = ["BACKENDS", "ModelSpec", "Problem", "ConfigurationError", "LazyStreamer", "parse_devices"]

#: The backends a spec may name.
BACKENDS = ("thread", "process", "redis")
DEFAULT_BATCH_SIZE = 64


class ConfigurationError(StreamerError, ValueError):
    """A setting is wrong; the message names it and says how to fix it.
    ``messages`` holds one line per wrong setting."""

    messages: List[str] = []


class Problem(NamedTuple):
    """One wrong setting. ``field`` is the :class:`ModelSpec` field; ``kind``
    groups problems for the frameworks' error codes: ``backend``, ``model``,
    ``size`` (a count that must be a positive int), ``seconds``,
    ``devices``, ``redis_url``, ``option`` (anything else)."""

    field: str
    kind: str
    message: str


def parse_devices(value: Any) -> Any:
    """Accept ``"0,1"`` (as an environment variable gives it) as ``[0, 1]``;
    anything else is returned as it is, to be checked."""
    if isinstance(value, str):
        parts = [part.strip() for part in value.split(",") if part.strip()]
        return [int(part) if part.lstrip("-").isdigit() else part for part in parts]
    return value


@dataclass(frozen=True)
class ModelSpec:
    """A batched model and how to serve it.

    ``model`` is a function taking a list of inputs and returning a list of
    outputs, or a :class:`ManagedModel` subclass (built where it runs: in the
    web process for ``thread``, in each worker for ``process`` and ``redis``).
    Times are in seconds. ``prefix`` names the Redis keys of this model; web
    processes and workers must agree on it.
    """

    name: str
    model: Any
    backend: str = "thread"
    batch_size: int = DEFAULT_BATCH_SIZE
    max_latency: float = DEFAULT_MAX_LATENCY
    timeout: float = DEFAULT_TIMEOUT
    max_queue: Optional[int] = None
    worker_num: int = 1
    cuda_devices: Optional[Sequence[DeviceId]] = None
    redis_url: Optional[str] = None
    prefix: str = ""
    init_args: Tuple[Any, ...] = ()
    init_kwargs: Dict[str, Any] = field(default_factory=dict)
    codec: str = "msgpack"
    item_cost: Any = None  # a function of one input, or its import path ("myapp.ml:token_count")
    max_batch_cost: Optional[float] = None
    batch_cost: str = "max"

    def problems(self, setting: Callable[[str], str] = str) -> List[Problem]:
        """Every wrong value, each message naming the setting to change
        (``setting(field)``: ``"STREAMER_BATCH_SIZE"`` for Flask, say)."""
        found: List[Problem] = []

        def add(name: str, kind: str, message: str) -> None:
            found.append(Problem(name, kind, f"{setting(name)} {message}"))

        if self.backend not in BACKENDS:
            add("backend", "backend", f"is {self.backend!r}; use one of {', '.join(map(repr, BACKENDS))}")
        if isinstance(self.model, type):
            if not issubclass(self.model, ManagedModel):
                add(
                    "model",
                    "model",
                    f"is the class {self.model.__name__}, which is not a ManagedModel subclass; "
                    "give a ManagedModel subclass or a function taking a list",
                )
        elif not callable(self.model):
            add("model", "model", f"is {self.model!r}; give a function taking a list or a ManagedModel subclass")
        for name, minimum in (("batch_size", 1), ("worker_num", 1)):
            value = getattr(self, name)
            if not _is_int(value, minimum):
                add(name, "size", f"must be a whole number >= {minimum}, got {value!r}")
        if self.max_queue is not None and not _is_int(self.max_queue, 1):
            add("max_queue", "size", f"must be a whole number >= 1, or None for no limit; got {self.max_queue!r}")
        for name, allow_zero in (("max_latency", True), ("timeout", False)):
            value = getattr(self, name)
            bound = f"{'>= 0' if allow_zero else '> 0'}, at most {MAX_SECONDS:.0f}"
            if not _is_seconds(value, allow_zero):
                add(name, "seconds", f"is in seconds and must be a finite number {bound}, got {value!r}")
        found.extend(
            Problem("cuda_devices", "devices", f"{setting('cuda_devices')} {text}")
            for text in _device_problems(self.cuda_devices)
        )
        if self.backend == "redis":
            if not self.redis_url or not isinstance(self.redis_url, str):
                add("redis_url", "redis_url", "must be set for the redis backend, e.g. 'redis://127.0.0.1:6379/0'")
            elif "://" not in self.redis_url and ":" not in self.redis_url:
                add("redis_url", "redis_url", f"must be a redis:// URL or host:port, got {self.redis_url!r}")
        if not isinstance(self.prefix, str):
            add("prefix", "option", f"must be a string, got {self.prefix!r}")
        if self.codec not in ("msgpack", "pickle"):
            add(
                "codec",
                "option",
                f"must be 'msgpack' or 'pickle' (pickle only with a trusted broker), got {self.codec!r}",
            )
        found.extend(self._cost_problems(setting))
        if not isinstance(self.init_args, (tuple, list)):
            add("init_args", "option", f"must be a list of arguments for init_model, got {self.init_args!r}")
        if not isinstance(self.init_kwargs, dict):
            add(
                "init_kwargs", "option", f"must be a dict of keyword arguments for init_model, got {self.init_kwargs!r}"
            )
        return found

    def _cost_problems(self, setting: Callable[[str], str]) -> List[Problem]:
        found = []
        if self.item_cost is not None:
            try:
                self.cost_function()
            except ValueError as exc:
                found.append(Problem("item_cost", "option", f"{setting('item_cost')} {exc}"))
        if self.max_batch_cost is not None:
            try:
                check_cost("", self.max_batch_cost)
            except (TypeError, ValueError):
                found.append(
                    Problem(
                        "max_batch_cost",
                        "option",
                        f"{setting('max_batch_cost')} must be a finite number > 0 (the most one batch may cost, "
                        f"in item_cost's units), or None for no limit; got {self.max_batch_cost!r}",
                    )
                )
        if self.batch_cost not in BATCH_COST_RULES:
            found.append(
                Problem(
                    "batch_cost",
                    "option",
                    f"{setting('batch_cost')} must be 'max' (length times the costliest input, for a model "
                    f"that pads its batch) or 'sum'; got {self.batch_cost!r}",
                )
            )
        return found

    def cost_function(self) -> Optional[Callable[[Any], float]]:
        """``item_cost`` as a function (imported when given as a path);
        raises ``ValueError`` saying what is wrong with it."""
        cost = self.item_cost
        if isinstance(cost, str):
            from .cli import import_target

            try:
                cost = import_target(cost)
            except ValueError as exc:
                raise ValueError(f"is {self.item_cost!r}, which does not import: {exc}") from None
        if cost is not None and (isinstance(cost, type) or not callable(cost)):
            raise ValueError(f"must be a function of one input returning a positive number, got {cost!r}")
        return cost

    def check(self, setting: Callable[[str], str] = str) -> ModelSpec:
        """Raise :class:`ConfigurationError` listing every problem; return self."""
        found = self.problems(setting)
        if found:
            where = f" (for {self.name})" if self.name else ""
            raise ConfigurationError(f"bad streamer settings{where}:\n  " + "\n  ".join(p.message for p in found))
        return self

    def build(self) -> BaseStreamer:
        """Start this model's streamer in this process. For ``thread`` with a
        :class:`ManagedModel` subclass, the model is built here and now."""
        from .backends.process import Streamer
        from .backends.thread import ThreadedStreamer

        common: Dict[str, Any] = dict(timeout=self.timeout, max_queue=self.max_queue, item_cost=self.cost_function())
        if self.name:
            common["name"] = self.name
        if self.backend != "redis":  # Redis workers shape their batches: see worker_group
            common.update(max_batch_cost=self.max_batch_cost, batch_cost=self.batch_cost)
        devices = parse_devices(self.cuda_devices)
        if self.backend == "thread":
            predict = self.model
            if isinstance(predict, type):
                predict = load_predict(predict, devices[0] if devices else None, self.init_args, self.init_kwargs)
            return ThreadedStreamer(predict, self.batch_size, self.max_latency, **common)
        if self.backend == "process":
            return Streamer(
                self.model,
                self.batch_size,
                self.max_latency,
                self.worker_num,
                devices,
                list(self.init_args),
                dict(self.init_kwargs),
                **common,
            )
        if self.backend == "redis":
            from .backends.redis import RedisStreamer

            # A web service answers 503 at once when no worker is alive, rather
            # than letting requests wait out their timeout.
            return RedisStreamer(self.redis_url or "", self.prefix, codec=self.codec, require_workers=True, **common)
        raise ConfigurationError(f"unknown backend {self.backend!r}; use one of {', '.join(BACKENDS)}")

    def worker_group(self, worker_num: Optional[int] = None, cuda_devices: Optional[Sequence[DeviceId]] = None) -> Any:
        """The Redis workers of this model, for ``run_worker_groups``;
        ``worker_num`` and ``cuda_devices`` override the spec's."""
        from .backends.redis import WorkerGroup

        devices = parse_devices(cuda_devices if cuda_devices is not None else self.cuda_devices)
        options = dict(
            model_class=self.model,
            batch_size=self.batch_size,
            max_latency=self.max_latency,
            redis_broker=self.redis_url or "",
            prefix=self.prefix,
            model_init_args=list(self.init_args),
            model_init_kwargs=dict(self.init_kwargs),
            codec=self.codec,
            # The web side computes item_cost and sends the cost with each
            # request: the workers need only the budget.
            max_batch_cost=self.max_batch_cost,
            batch_cost=self.batch_cost,
        )
        if self.name:
            options["name"] = self.name  # the metrics' model label, as on the web side
        count = worker_num if worker_num is not None else self.worker_num
        return WorkerGroup(self.name or callable_name(self.model), options, count, tuple(devices) if devices else None)


class LazyStreamer:
    """The streamer of one :class:`ModelSpec` in this process, started on
    first use by :meth:`get` (thread-safe) and again after a fork."""

    def __init__(self, spec: ModelSpec) -> None:
        self.spec = spec
        self._lock = threading.Lock()
        self._streamer: Optional[BaseStreamer] = None
        self._pid = 0
        self._starting: Optional[threading.Thread] = None
        self._starting_pid = 0
        #: Why the last start in the background failed, if it did.
        self.start_error: Optional[BaseException] = None

    def get(self) -> BaseStreamer:
        streamer = self._streamer
        if streamer is not None and self._pid == os.getpid() and not streamer.closed:
            return streamer
        with self._lock:
            streamer = self._streamer
            if streamer is not None and self._pid != os.getpid():
                streamer._finalizer.detach()  # the parent's: its threads are not in this process
                streamer = None
            if streamer is None or streamer.closed:
                try:
                    streamer = self.spec.build()
                except StreamerError:
                    raise
                except Exception as exc:
                    # The thread backend builds a ManagedModel here: failing to
                    # load is the process backend's WorkerStartError (a 503),
                    # and the next call tries again.
                    raise WorkerStartError(
                        f"the model {self.spec.name!r} could not start: {type(exc).__name__}: {exc}"
                    ) from exc
                self._streamer = streamer
                self._pid = os.getpid()
            return streamer

    def start_in_background(self) -> threading.Thread:
        """Start the streamer on a thread of its own (a model built in this
        process may take a while), unless that is under way; return the thread.
        An error is kept in :attr:`start_error` for a readiness probe."""
        with self._lock:
            thread = self._starting
            if thread is None or not thread.is_alive() or self._starting_pid != os.getpid():
                thread = threading.Thread(target=self._start, name=f"streamer-start-{self.spec.name}", daemon=True)
                self._starting, self._starting_pid = thread, os.getpid()
                thread.start()
            return thread

    def _start(self) -> None:
        try:
            self.get()
            self.start_error = None
        except Exception as exc:
            self.start_error = exc

    @property
    def started(self) -> bool:
        """Whether this process has started the streamer."""
        return self._streamer is not None and self._pid == os.getpid() and not self._streamer.closed

    def close(self, timeout: float = 10.0) -> None:
        """Close the streamer if this process started it; the next
        :meth:`get` starts a new one."""
        with self._lock:
            streamer, self._streamer = self._streamer, None
        if streamer is not None and self._pid == os.getpid():
            streamer.close(timeout)


def _is_int(value: Any, minimum: int) -> bool:
    """Whether ``value`` passes :func:`~streamer_core.config._check_int`, the
    rule every streamer applies (the message here names the setting)."""
    try:
        _check_int("", value, minimum)
    except (TypeError, ValueError):
        return False
    return True


def _is_seconds(value: Any, allow_zero: bool) -> bool:
    """Whether ``value`` passes :func:`~streamer_core.config._check_seconds`."""
    try:
        _check_seconds("", value, allow_zero=allow_zero)
    except (TypeError, ValueError):
        return False
    return True


def _device_problems(devices: Any) -> List[str]:
    if devices is None:
        return []
    devices = parse_devices(devices)
    if not isinstance(devices, (list, tuple)):
        return [f"must be a list of device indexes such as [0, 1] (or the string '0,1'), got {devices!r}"]
    if not devices:
        return ["must name at least one device, or be None to leave CUDA_VISIBLE_DEVICES alone"]
    problems = []
    for device in devices:
        if isinstance(device, bool) or not isinstance(device, (int, str)):
            problems.append(f"holds {device!r}: each device must be an int index (0, 1, ...) or a GPU UUID string")
        elif isinstance(device, int) and device < 0:
            problems.append(f"holds {device!r}: device indexes start at 0")
    return problems
