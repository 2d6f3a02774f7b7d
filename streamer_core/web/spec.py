"""One batched model as a web framework's settings describe it.

The Flask extension (``app.config["STREAMER_*"]``) and the Django app
(``settings.STREAMER["MODELS"]``) both turn their settings into a
:class:`ModelSpec` by :meth:`ModelSpec.from_settings`: which backend, which
model, and its options, each checked by its option's own check
(:data:`~streamer_core.options.config.OPTIONS`), with every wrong value listed under
the name the user wrote it by, so each framework can report them its own way
(an exception at ``init_app``, system checks under Django). A spec then
builds the streamer (:meth:`ModelSpec.build`) or the Redis workers
(:meth:`ModelSpec.worker_group`), handing its :class:`BatchingConfig` on.

:class:`LazyStreamer` holds a spec's streamer in one web process: it is made
on first use, never at import, and made again in a forked child (gunicorn
forks its workers after importing the app with ``--preload``), because a
streamer's threads do not survive a fork.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass, fields
from typing import Any, Callable, Dict, Iterable, List, Mapping, NamedTuple, Optional, Tuple

from ..errors import ConfigurationError, StreamerError, WorkerStartError
from ..managed_model import ManagedModel, load_predict
from ..options.config import OPTIONS, BatchingConfig, DeviceId, priority_problem
from ..options.redis_address import ADDRESS_FORMS, RedisAddress
from ..streamer import BaseStreamer, callable_name, forks, logger
from ..threads import background

__all__ = ["MODEL_SETTINGS", "ModelSpec", "Problem", "LazyStreamer", "start_all"]

#: The options a web layer's settings give each model, in the order they are
#: checked and documented: Flask's ``STREAMER_<NAME>``, Django's ``<NAME>``.
MODEL_SETTINGS: Tuple[str, ...] = (
    "backend",
    "batch_size",
    "max_latency",
    "worker_num",
    "model_threads",
    "cuda_devices",
    "redis_url",
    "prefix",
    "timeout",
    "max_queue",
    "codec",
    "item_cost",
    "max_batch_cost",
    "batch_cost",
    "tracing",
    "priority_levels",
    "default_priority",
    "priority_aging",
    "priority_max_queue",
    "priority_timeout",
    "overload_after",
    "overload_wait",
)
_BATCHING = tuple(field.name for field in fields(BatchingConfig))


class Problem(NamedTuple):
    """One wrong setting. ``field`` is the option; ``kind`` groups problems
    for the frameworks' error codes: ``backend``, ``model``, ``size`` (a
    count that must be a positive int), ``seconds``, ``devices``,
    ``redis_url``, ``option`` (anything else)."""

    field: str
    kind: str
    message: str


@dataclass(frozen=True)
class ModelSpec:
    """A batched model and how to serve it, its settings checked: made by
    :meth:`from_settings` (or :meth:`checked`).

    ``model`` is a function taking a list of inputs and returning a list of
    outputs, or a :class:`ManagedModel` subclass (built where it runs: in the
    web process for ``thread``, in each worker for ``process`` and ``redis``).
    ``prefix`` names the Redis keys of this model; web processes and workers
    must agree on it.
    """

    name: str
    model: Any
    backend: str
    config: BatchingConfig
    worker_num: int
    model_threads: int
    cuda_devices: Optional[Tuple[DeviceId, ...]]
    redis_url: Optional[RedisAddress]
    prefix: str
    codec: str
    init_args: Tuple[Any, ...]
    init_kwargs: Dict[str, Any]

    @property
    def redis(self) -> RedisAddress:
        """The Redis address of a model on the redis backend (set: checked)."""
        if self.redis_url is None:
            raise ConfigurationError(f"{self.name or 'this model'} has no Redis address: set its redis_url")
        return self.redis_url

    @classmethod
    def from_settings(
        cls, name: str, model: Any, values: Mapping[str, Any], written_as: Callable[[str], str] = str
    ) -> Tuple[Optional[ModelSpec], List[Problem]]:
        """The spec of ``model`` under the settings ``values`` (by option
        name; a missing one takes its default), or ``None`` and every wrong
        value, each message naming the setting as ``written_as(option)``
        (``"STREAMER_BATCH_SIZE"`` for Flask, say)."""
        problems: List[Problem] = []
        if isinstance(model, type):
            if not issubclass(model, ManagedModel):
                problems.append(
                    Problem(
                        "model",
                        "model",
                        f"{written_as('model')} is the class {model.__name__}, which is not a ManagedModel subclass; "
                        "give a ManagedModel subclass or a function taking a list",
                    )
                )
        elif not callable(model):
            problems.append(
                Problem(
                    "model",
                    "model",
                    f"{written_as('model')} is {model!r}; give a function taking a list or a ManagedModel subclass",
                )
            )
        kept: Dict[str, Any] = {}
        for field in (*MODEL_SETTINGS, "init_args", "init_kwargs"):
            option = OPTIONS[field]
            try:
                kept[field] = option.checked(values.get(field, option.default), written_as(field))
            except (TypeError, ValueError) as exc:
                problems.append(Problem(field, option.kind, str(exc)))
        if kept.get("backend") == "redis" and "redis_url" in kept and kept["redis_url"] is None:
            problems.append(
                Problem(
                    "redis_url",
                    "redis_url",
                    f"{written_as('redis_url')} must be set for the redis backend, e.g. 'redis://127.0.0.1:6379/0' "
                    f"({ADDRESS_FORMS})",
                )
            )
        if kept.get("backend") in ("process", "redis") and kept.get("model_threads", 1) > 1:
            # A setting that would do nothing is a mistake to say at once.
            problems.append(
                Problem(
                    "model_threads",
                    "option",
                    f"{written_as('model_threads')} is the thread backend's: the {kept['backend']} backend runs "
                    f"{written_as('worker_num')} worker processes instead; set that, or leave "
                    f"{written_as('model_threads')} at 1",
                )
            )
        if not problems and kept.get("backend") == "process" and _local(model):
            # Else every request would get a 503 that no retry can help.
            problems.append(
                Problem(
                    "model",
                    "model",
                    f"{written_as('model')}: {callable_name(model)} is a lambda or is defined inside a function; "
                    "the process backend's workers import the model by its module and name: define it at module level",
                )
            )
        if not problems:
            problem = priority_problem(kept, written_as)
            if problem is not None:
                problems.append(Problem("priority_levels", "option", problem))
        if problems:
            return None, problems
        config = BatchingConfig.of_checked(kept)  # each value checked above, under its setting's name
        others = {field: kept[field] for field in kept if field not in _BATCHING}
        return cls(name=name, model=model, config=config, **others), []

    @classmethod
    def checked(
        cls, name: str, model: Any, values: Mapping[str, Any], written_as: Callable[[str], str] = str
    ) -> ModelSpec:
        """:meth:`from_settings`, raising :class:`ConfigurationError` that
        lists every problem."""
        spec, problems = cls.from_settings(name, model, values, written_as)
        if spec is None:
            where = f" (for {name})" if name else ""
            messages = [problem.message for problem in problems]
            raise ConfigurationError(f"bad streamer settings{where}:\n  " + "\n  ".join(messages), messages)
        return spec

    def build(self) -> BaseStreamer:
        """Start this model's streamer in this process. For ``thread`` with a
        :class:`ManagedModel` subclass, the model is built here and now."""
        from ..backends.process import Streamer
        from ..backends.thread import ThreadedStreamer

        config, name = self.config, self.name or None
        if self.backend == "thread":
            predict = self.model
            if isinstance(predict, type):
                device = self.cuda_devices[0] if self.cuda_devices else None
                if self.cuda_devices and len(self.cuda_devices) > 1:
                    logger.warning(
                        "%s: the thread backend runs one copy of the model, on device %s; the other devices of "
                        "cuda_devices are not used (the process or redis backend runs a worker on each)",
                        self.name or callable_name(self.model),
                        device,
                    )
                predict = load_predict(predict, device, self.init_args, self.init_kwargs)
            elif self.cuda_devices:
                logger.warning(
                    "%s: cuda_devices is not used by the thread backend for a function: it runs in this process "
                    "as it is (put the model on its device yourself, make it a ManagedModel, or use the process "
                    "or redis backend)",
                    self.name or callable_name(self.model),
                )
            return ThreadedStreamer.from_config(predict, config, name=name, model_threads=self.model_threads)
        if self.backend == "process":
            return Streamer.from_config(
                self.model,
                config,
                self.worker_num,
                self.cuda_devices,
                list(self.init_args),
                dict(self.init_kwargs),
                name=name,
            )
        from ..backends.redis import RedisStreamer

        # A web service answers 503 at once when no worker is alive, rather
        # than letting requests wait out their timeout. The workers shape the
        # batches (see worker_group); this side costs each input.
        return RedisStreamer(
            self.redis,
            self.prefix,
            codec=self.codec,
            require_workers=True,
            timeout=config.timeout,
            max_queue=config.max_queue,
            item_cost=config.item_cost,
            name=name,
            tracing=config.tracing,
            priority_levels=config.priority_levels,
            default_priority=config.default_priority,
            priority_max_queue=config.priority_max_queue,
            priority_timeout=config.priority_timeout,
            overload_after=config.overload_after,
            overload_wait=config.overload_wait,
        )

    def worker_group(self, worker_num: Optional[int] = None, cuda_devices: Any = None) -> Any:
        """The Redis workers of this model, for ``run_worker_groups``;
        ``worker_num`` and ``cuda_devices`` (``--workers`` and ``--devices``
        of the worker commands) override the spec's."""
        from ..backends.redis import WorkerGroup

        if cuda_devices is not None:
            devices = OPTIONS["cuda_devices"].checked(cuda_devices, "--devices")
        else:
            devices = self.cuda_devices
        count = self.worker_num if worker_num is None else OPTIONS["worker_num"].checked(worker_num, "--workers")
        config = self.config
        options: Dict[str, Any] = dict(
            model_class=self.model,
            batch_size=config.batch_size,
            max_latency=config.max_latency,
            redis_broker=self.redis,
            prefix=self.prefix,
            model_init_args=list(self.init_args),
            model_init_kwargs=dict(self.init_kwargs),
            codec=self.codec,
            **config.model_options(),
        )
        # The web side computes item_cost and sends the cost with each request
        # (a function given in the web app's settings need not even pickle).
        del options["item_cost"]
        if self.name:
            options["name"] = self.name  # the metrics' model label, as on the web side
        return WorkerGroup(self.name or callable_name(self.model), options, count, devices)


def _say_start(spec: ModelSpec, at_boot: bool) -> None:
    if spec.backend == "redis":  # nothing loads here: the workers have the model
        when = "as the server starts" if at_boot else "on its first use"
        logger.info("model %r (redis backend): connecting %s", spec.name, when)
    elif at_boot:
        logger.info("model %r (%s backend): loading as the server starts", spec.name, spec.backend)
    else:
        logger.info(
            "model %r (%s backend): loading on its first use; the request that needs it waits "
            "(start_streamers() as the server boots loads it before any request)",
            spec.name,
            spec.backend,
        )


class LazyStreamer:
    """The streamer of one :class:`ModelSpec` in this process, started on
    first use by :meth:`get` (thread-safe) and again after a fork."""

    def __init__(self, spec: ModelSpec) -> None:
        self.spec = spec
        self._lock = threading.Lock()  # held while the streamer is built (a model loading)
        self._streamer: Optional[BaseStreamer] = None
        # The process that started it, and its count of forks then (asked
        # on every request: a fork since makes the streamer the parent's).
        self._pid = 0
        self._forks = -1
        # The start in the background has a lock of its own: a readiness
        # probe asking for it while a model loads must not wait for the load.
        self._starting_lock = threading.Lock()
        self._starting: Optional[threading.Thread] = None
        self._starting_pid = 0
        #: Why the last start in the background failed, if it did.
        self.start_error: Optional[BaseException] = None

    def get(self, at_boot: bool = False) -> BaseStreamer:
        """The streamer, started in this process if it is not yet: on its
        first use (a request, which then waits for the model to load) or,
        ``at_boot``, as the server starts. Either is said in one line, so a
        first answer that takes seconds is explained."""
        streamer = self._streamer
        if streamer is not None and self._forks == forks() and not streamer.closed:
            return streamer
        with self._lock:
            streamer = self._streamer
            if streamer is not None and self._pid != os.getpid():
                streamer._finalizer.detach()  # the parent's: its threads are not in this process
                streamer = None
            if streamer is None or streamer.closed:
                _say_start(self.spec, at_boot)
                try:
                    streamer = self.spec.build()
                except ConfigurationError as exc:
                    # A setting only a start can check (Redis refusing the
                    # database number or the password): said as a setting
                    # where the server starts; at a request, a 503 as below.
                    if at_boot:
                        raise
                    raise WorkerStartError(f"the model {self.spec.name!r} could not start: {exc}") from exc
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
                self._pid, self._forks = os.getpid(), forks()
            return streamer

    def start_in_background(self) -> threading.Thread:
        """Start the streamer on a thread of its own (a model built in this
        process may take a while), unless that is under way; return the thread.
        An error is kept in :attr:`start_error` for a readiness probe. It does
        not wait for a start under way elsewhere (a request's, the server's at
        boot): its thread does."""
        with self._starting_lock:
            thread = self._starting
            if thread is None or not thread.is_alive() or self._starting_pid != os.getpid():
                thread = background(self._start, f"streamer-start-{self.spec.name}")
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


def start_all(handles: Iterable[LazyStreamer], wait: bool = True, timeout: float = 120.0) -> None:
    """Start the streamer of each of ``handles`` in this process (a web
    layer's models), all at once; with ``wait``, until the models this
    process runs have loaded, for up to ``timeout`` seconds each. Redis
    workers run elsewhere, and are not waited for."""
    started = [(handle, handle.get(at_boot=True)) for handle in handles]
    if wait:
        for handle, streamer in started:
            if handle.spec.backend != "redis":
                streamer.wait_ready(timeout)


def _local(model: Any) -> bool:
    """Whether ``model`` can never be imported by name (a lambda, or a
    function or class defined inside a function). A module-level function
    being decorated is not bound to its name yet, and is no such model."""
    qualname = getattr(model, "__qualname__", "")
    return "<locals>" in qualname or "<lambda>" in qualname
