"""The batching configuration shared by every backend, validated when it is made.

This is the one source of defaults: the Flask and Django layers translate
their settings into a :class:`BatchingConfig`, and every streamer builds one
from its keyword arguments, so a wrong value fails at construction with a
message that says how to fix it, not at the first request.
"""

from __future__ import annotations

import logging
import math
import numbers
from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence, Tuple, Type, Union

from .oom import check_oom_errors

__all__ = ["BatchingConfig", "DeviceId"]

#: How the worker commands and worker processes write their log lines.
LOG_FORMAT = "%(asctime)s %(name)s[%(process)d] %(levelname)s %(message)s"

#: A CUDA device as ``CUDA_VISIBLE_DEVICES`` takes it: an index or a UUID string.
DeviceId = Union[int, str]


def show_logs(level: int | str) -> None:
    """Write log lines at ``level`` to stderr, for the worker commands that
    load a web app first (``flask streamer run-workers``, ``manage.py
    run_gpu_workers``): through a root handler in :data:`LOG_FORMAT`, unless
    one is there already, or unless the app put a handler on
    ``streamer_core``'s own logger while it loaded (the Flask example does,
    so that its lines show under any server): a root handler beside that
    one would print each line twice. Either way ``streamer_core``'s lines
    show at ``level``, and the workers these commands start log at it too."""
    root, ours = logging.getLogger(), logging.getLogger("streamer_core")
    if not root.handlers and not ours.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter(LOG_FORMAT))
        root.addHandler(handler)
    root.setLevel(level)
    if ours.level != logging.NOTSET:
        ours.setLevel(level)


DEFAULT_MAX_LATENCY = 0.1
DEFAULT_TIMEOUT = 20.0
#: The longest timeout, max_latency or claim_after taken, seconds (a day).
#: A wait longer than that is a hang by another name; a request through Redis
#: carries its timeout within this bound; and far enough above it
#: (``threading.TIMEOUT_MAX``) a timed wait raises OverflowError, which would
#: stop a streamer's dispatcher.
MAX_SECONDS = 86_400.0
#: How a batch's cost follows from its inputs' costs (``batch_cost``).
BATCH_COST_RULES = ("max", "sum")


def _check_int(name: str, value: Any, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int >= {minimum}, got {value!r} ({type(value).__name__})")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value!r}")
    return value


def _check_seconds(name: str, value: Any, *, allow_zero: bool) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} is in seconds and must be a number, got {value!r} ({type(value).__name__})")
    seconds = float(value)
    if not math.isfinite(seconds) or seconds < 0 or (seconds == 0 and not allow_zero):
        bound = ">= 0" if allow_zero else "> 0"
        raise ValueError(f"{name} is in seconds and must be finite and {bound}, got {seconds!r}")
    if seconds > MAX_SECONDS:
        raise ValueError(f"{name} is in seconds and must be at most {MAX_SECONDS:.0f} (a day), got {seconds!r}")
    return seconds


def check_cost(name: str, value: Any) -> float:
    """A cost: a finite number > 0 (an int, a float, a NumPy scalar)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a positive number, got {value!r} ({type(value).__name__})")
    cost = float(value)
    if not math.isfinite(cost) or cost <= 0:
        raise ValueError(f"{name} must be a finite number > 0, got {value!r}")
    return cost


def check_devices(name: str, devices: Optional[Sequence[DeviceId]]) -> Optional[Tuple[DeviceId, ...]]:
    """Validate a list of CUDA devices (``None`` means: do not set the variable)."""
    if devices is None:
        return None
    if isinstance(devices, (str, bytes)) or not isinstance(devices, Sequence):
        raise TypeError(f"{name} must be a list of device indexes such as [0, 1], got {devices!r}")
    if not devices:
        raise ValueError(f"{name} must name at least one device, or be None to leave CUDA_VISIBLE_DEVICES alone")
    checked = []
    for device in devices:
        if isinstance(device, bool) or not isinstance(device, (int, str)):
            raise TypeError(f"{name} holds {device!r}: each device must be an int index (0, 1, ...) or a UUID string")
        if isinstance(device, int) and device < 0:
            raise ValueError(f"{name} holds {device!r}: device indexes start at 0")
        if isinstance(device, str) and not device.strip():
            raise ValueError(f"{name} holds an empty string: name the device by index or UUID")
        checked.append(device)
    return tuple(checked)


@dataclass(frozen=True)
class BatchingConfig:
    """How requests are grouped into batches and how long a call may take.

    batch_size
        The most items one model call receives.
    max_latency
        Seconds the oldest queued item may wait for companions, counted from
        its arrival. A lone request does not wait at all when no companions
        are arriving (see ``batching.Scheduler``).
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
        text's token count, an image's pixels). When set, a batch starts with
        the oldest waiting input and fills with the waiting inputs closest to
        it in cost, so that inputs of like cost run together. It runs in the
        caller's thread, before the input is queued.
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
        what ran (see :mod:`streamer_core.oom`). ``None``: torch's
        ``torch.cuda.OutOfMemoryError`` when torch is loaded; ``()``: none.
    """

    batch_size: int
    max_latency: float = DEFAULT_MAX_LATENCY
    timeout: float = DEFAULT_TIMEOUT
    max_queue: Optional[int] = None
    isolate_errors: bool = True
    item_cost: Optional[Callable[[Any], float]] = None
    max_batch_cost: Optional[float] = None
    batch_cost: str = "max"
    oom_errors: Optional[Tuple[Type[BaseException], ...]] = None

    def __post_init__(self) -> None:
        _check_int("batch_size", self.batch_size, 1)
        object.__setattr__(self, "max_latency", _check_seconds("max_latency", self.max_latency, allow_zero=True))
        object.__setattr__(self, "timeout", _check_seconds("timeout", self.timeout, allow_zero=False))
        if self.max_queue is not None:
            _check_int("max_queue", self.max_queue, 1)
        if not isinstance(self.isolate_errors, bool):
            raise TypeError(f"isolate_errors must be True or False, got {self.isolate_errors!r}")
        if self.item_cost is not None and not callable(self.item_cost):
            raise TypeError(
                f"item_cost must be a function of one input returning a positive number, got {self.item_cost!r}"
            )
        if self.max_batch_cost is not None:
            object.__setattr__(self, "max_batch_cost", check_cost("max_batch_cost", self.max_batch_cost))
        object.__setattr__(self, "oom_errors", check_oom_errors(self.oom_errors))
        if self.batch_cost not in BATCH_COST_RULES:
            raise ValueError(
                f"batch_cost must be 'max' (length times the costliest input: a padding model) "
                f"or 'sum' (the inputs' costs added), got {self.batch_cost!r}"
            )

    @property
    def shapes_by_cost(self) -> bool:
        """Whether batches are shaped by cost at all (else: first in, first out, by count)."""
        return self.item_cost is not None or self.max_batch_cost is not None

    def call_timeout(self, timeout: Optional[float]) -> float:
        """The timeout of one call: its own, validated, or the configured one."""
        if timeout is None:
            return self.timeout
        return _check_seconds("timeout", timeout, allow_zero=False)
