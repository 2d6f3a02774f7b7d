"""The checks the options of :mod:`streamer_core.options.config` are made of: each
takes a value and returns it as kept, or raises ``TypeError``/``ValueError``
saying what is wrong without the option's name (:func:`checked` puts it in
front). Apart from the option table so that the table reads as one list."""

from __future__ import annotations

import math
import numbers
import re
from typing import Any, Callable, Dict, Optional, Sequence, Tuple, Type

#: The longest timeout, max_latency or claim_after taken, seconds (a day).
#: A wait longer than that is a hang by another name; a request through Redis
#: carries its timeout within this bound; and far enough above it
#: (``threading.TIMEOUT_MAX``) a timed wait raises OverflowError, which would
#: stop a streamer's dispatcher.
MAX_SECONDS = 86_400.0

Check = Callable[[Any], Any]

#: ``oom_errors`` as kept: the exception types taken for out of memory, or
#: ``None`` for torch's when torch is loaded (streamer_core.batching.oom).
OomErrors = Optional[Tuple[Type[BaseException], ...]]

__all__ = [
    "Check",
    "OomErrors",
    "check_oom_errors",
    "MAX_SECONDS",
    "checked",
    "whole",
    "check_seconds",
    "seconds",
    "check_cost",
    "budget",
    "flag",
    "one_of",
    "per_level",
    "header_name",
    "optional_flag",
    "text",
    "arguments",
    "keywords",
    "body_bytes",
]


def checked(name: str, check: Check, value: Any) -> Any:
    """``check(value)``; its ``TypeError`` or ``ValueError`` names ``name``."""
    try:
        return check(value)
    except (TypeError, ValueError) as exc:
        raise type(exc)(f"{name} {exc}") from None


def whole(minimum: int, *, optional: bool = False, unit: str = "") -> Check:
    """A whole number >= ``minimum`` (``None`` too, when ``optional``)."""
    what = f"a whole number{unit} >= {minimum}" + (", or None for no limit;" if optional else ",")

    def check(value: Any) -> Any:
        if value is None and optional:
            return None
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"must be {what} got {value!r}")
        if value < minimum:
            raise ValueError(f"must be {what} got {value!r}")
        return value

    return check


def check_seconds(value: Any, *, allow_zero: bool = False) -> float:
    """A number of seconds: finite, > 0 (or >= 0), at most :data:`MAX_SECONDS`.
    Raises ``TypeError``/``ValueError`` saying so, without a name."""
    bound = ">= 0" if allow_zero else "> 0"
    what = f"is in seconds and must be a finite number {bound}, at most {MAX_SECONDS:.0f} (a day); got {value!r}"
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(what)
    seconds = float(value)
    if not math.isfinite(seconds) or seconds < 0 or (seconds == 0 and not allow_zero) or seconds > MAX_SECONDS:
        raise ValueError(what)
    return seconds


def seconds(*, allow_zero: bool = False, optional: bool = False) -> Check:
    def check(value: Any) -> Any:
        if value is None and optional:
            return None
        return check_seconds(value, allow_zero=allow_zero)

    return check


def check_cost(value: Any) -> float:
    """A cost: a finite number > 0 (an int, a float, a NumPy scalar).
    Raises ``TypeError``/``ValueError`` saying so, without a name."""
    if type(value) is float and 0 < value < math.inf:  # the common case, checked for every input
        return value
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"must be a finite number > 0, got {value!r} ({type(value).__name__})")
    cost = float(value)
    if not math.isfinite(cost) or cost <= 0:
        raise ValueError(f"must be a finite number > 0, got {value!r}")
    return cost


def budget(value: Any) -> Optional[float]:
    if value is None:
        return None
    return check_cost(value)


def flag(value: Any) -> bool:
    """True or False; 1 and 0 too, as a setting read as JSON may give them."""
    if value in (0, 1) and not isinstance(value, float):
        return bool(value)
    raise TypeError(f"must be True or False, got {value!r}")


def one_of(choices: Sequence[str], explained: str) -> Check:
    def check(value: Any) -> Any:
        if value not in choices:
            raise ValueError(f"{explained}, got {value!r}")
        return value

    return check


def per_level(each: Check, what: str) -> Check:
    """A list of one value per priority level, each checked by ``each``
    (its count is checked against ``priority_levels`` by
    :func:`priority_problem`); ``None``: not set."""

    def check(value: Any) -> Any:
        if value is None:
            return None
        if isinstance(value, (str, bytes)) or not isinstance(value, (list, tuple)):
            raise TypeError(f"must be a list with one value per priority level, each {what}; got {value!r}")
        kept = []
        for index, one in enumerate(value):
            try:
                kept.append(each(one))
            except (TypeError, ValueError) as exc:
                raise ValueError(f"[{index}] (priority {index + 1}) {exc}") from None
        return tuple(kept)

    return check


def header_name(value: Any) -> Optional[str]:
    """``timeout_header``: a request header's name, or None (``False`` too) for none."""
    if value is None or value is False:
        return None
    if isinstance(value, str) and re.fullmatch(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+", value):
        return value
    raise TypeError(f"must be the name of a request header, e.g. 'X-Request-Timeout', or None; got {value!r}")


def optional_flag(value: Any) -> Optional[bool]:
    """None, or a flag (:func:`~streamer_core.options.checks.flag`)."""
    return None if value is None else flag(value)


def text(value: Any) -> str:
    """Text; a whole number as its digits (``FLASK_STREAMER_PREFIX=2024``
    arrives as the number once Flask reads it as JSON)."""
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    if not isinstance(value, str):
        raise TypeError(f"must be a string, got {value!r}")
    return value


def arguments(value: Any) -> Tuple[Any, ...]:
    if not isinstance(value, (tuple, list)):
        raise TypeError(f"must be a list of arguments for init_model, got {value!r}")
    return tuple(value)


def keywords(value: Any) -> Dict[str, Any]:
    if not isinstance(value, dict):
        raise TypeError(f"must be a dict of keyword arguments for init_model, got {value!r}")
    return dict(value)


def body_bytes(value: Any) -> Optional[int]:
    if value is None or (isinstance(value, int) and not isinstance(value, bool) and value >= 1):
        return value
    raise ValueError(
        f"must be a whole number of bytes, at least 1 (e.g. {10 * 1024 * 1024} for 10 MiB), or None for no limit; "
        f"got {value!r}"
    )


def check_oom_errors(value: Any) -> OomErrors:
    """``None`` (torch's error, when torch is loaded), or a tuple of exception types."""
    if value is None:
        return None
    if isinstance(value, type) and issubclass(value, BaseException):
        return (value,)
    if not isinstance(value, (tuple, list)) or not all(
        isinstance(kind, type) and issubclass(kind, BaseException) for kind in value
    ):
        raise TypeError(
            "oom_errors must be a tuple of exception types (e.g. (torch.cuda.OutOfMemoryError,)), "
            f"() for none, or None for torch's when torch is loaded; got {value!r}"
        )
    return tuple(value)
