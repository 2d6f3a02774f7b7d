"""A request's deadline, from the client: how long it will still wait,
said in a request header, so that an input whose caller will have left
before it could be answered is never run.

A client that gives up after a second and asks again (a retry storm) is
invisible to the server otherwise: its call keeps the route's timeout, the
queue holds inputs nobody will read, and first come first served runs
them. With the client's patience known, the call's timeout is that
patience (never more than the route's own), and every backend's rule
applies: an input whose deadline comes before a batch could answer it is
dropped unrun and its call answered 504 at once (the README's "Callers
who leave"); a Redis worker drops it too, the deadline travelling with it.

Headers read (:class:`EndpointDeadline`):

- :data:`TIMEOUT_HEADER` (``X-Request-Timeout``): seconds, a decimal
  number, read unless the endpoint turns it off (``timeout_header=None``)
  or names another header; a client can only shorten its own wait, so it
  is safe to honour from anyone;
- :data:`ENVOY_TIMEOUT_HEADER` (``x-envoy-expected-rq-timeout-ms``),
  where the endpoint allows it (``envoy_timeout=True``): whole
  milliseconds, as Envoy sets it from its route's timeout.

A value that is not a number greater than 0 is a 400 that says what to
send, before anything is read or queued. Where both are sent, the shorter
counts.
"""

from __future__ import annotations

import functools
import math
import re
from typing import Any, Callable, Mapping, NamedTuple, Optional

from ..errors import InvalidInput
from ..options.config import BatchingConfig

__all__ = ["TIMEOUT_HEADER", "ENVOY_TIMEOUT_HEADER", "EndpointDeadline", "environ_headers"]

#: The request header that says, in seconds, how long the client still waits.
TIMEOUT_HEADER = "X-Request-Timeout"
#: Envoy's header of the same, in milliseconds (read where an endpoint allows it).
ENVOY_TIMEOUT_HEADER = "x-envoy-expected-rq-timeout-ms"
# An HTTP header name (RFC 9110's token).
_HEADER_NAME = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+\Z")
# Seconds as a client writes them: digits, a point, digits.
_SECONDS = re.compile(r"[0-9]{1,9}(\.[0-9]{1,9})?\Z|\.[0-9]{1,9}\Z")
_MILLISECONDS = re.compile(r"[0-9]{1,12}\Z")

#: ``headers(name)``: the request's header ``name``, or ``None``.
Headers = Callable[[str], Optional[str]]


class EndpointDeadline(NamedTuple):
    """Which headers of a request say its deadline: ``header`` (seconds;
    ``None``: none) and, with ``envoy``, Envoy's (milliseconds)."""

    header: Optional[str] = TIMEOUT_HEADER
    envoy: bool = False

    @classmethod
    def checked(cls, timeout_header: Any, envoy_timeout: Any, where: str) -> EndpointDeadline:
        """The deadline headers of the endpoint ``where`` ("the batched route
        '/embed'"): ``timeout_header`` is ``True`` (:data:`TIMEOUT_HEADER`),
        a header's name, or ``None``/``False`` for none; ``envoy_timeout``
        is ``True`` or ``False``. Raises ``TypeError`` saying what to write."""
        if timeout_header is None or timeout_header is False:
            header = None
        elif timeout_header is True:
            header = TIMEOUT_HEADER
        elif isinstance(timeout_header, str) and _HEADER_NAME.match(timeout_header):
            header = timeout_header
        else:
            raise TypeError(
                f"timeout_header of {where} must be the name of a request header (default {TIMEOUT_HEADER!r}), "
                f"True for that one, or None to read none; got {timeout_header!r}"
            )
        if not isinstance(envoy_timeout, bool):
            raise TypeError(
                f"envoy_timeout of {where} must be True (read {ENVOY_TIMEOUT_HEADER}) or False, got {envoy_timeout!r}"
            )
        return cls(header, envoy_timeout)

    @property
    def reads(self) -> bool:
        """Whether the endpoint reads any deadline header."""
        return self.header is not None or self.envoy

    def timeout(self, headers: Headers, config: BatchingConfig, level: Optional[int] = None) -> Optional[float]:
        """The timeout of a call from a request whose headers ``headers``
        gives, to a model of ``config``, at priority ``level`` (1 the
        highest; ``None``: the model's default): the client's remaining
        wait, where it says one, never more than the model's own timeout
        for the call (``None``: it says none). Raises :class:`InvalidInput`
        (400) for a value that is not a number greater than 0."""
        found: Optional[float] = None
        if self.header is not None:
            value = headers(self.header)
            if value is not None:
                found = _seconds(self.header, value, _SECONDS, 1.0, "a number of seconds greater than 0, e.g. 2.5")
        if self.envoy:
            value = headers(ENVOY_TIMEOUT_HEADER)
            if value is not None:
                ms = _seconds(
                    ENVOY_TIMEOUT_HEADER, value, _MILLISECONDS, 0.001, "a whole number of milliseconds greater than 0"
                )
                found = ms if found is None else min(found, ms)
        if found is None:
            return None
        return min(found, config.call_timeout(None, config.level_of(level)))


def environ_headers(environ: Mapping[str, Any]) -> Headers:
    """A request's headers by name, read from its WSGI environ (Django's
    ``request.META`` too), without building a mapping of them all."""
    return lambda name: environ.get(_environ_key(name))


@functools.cache
def _environ_key(name: str) -> str:
    return "HTTP_" + name.upper().replace("-", "_")


def _seconds(name: str, value: str, form: re.Pattern[str], unit: float, what: str) -> float:
    """``value`` of the header ``name`` in seconds (``unit``: seconds per
    unit written), or :class:`InvalidInput` saying it must be ``what``."""
    text = value.strip()
    if form.match(text):
        seconds = float(text) * unit
        if seconds > 0 and math.isfinite(seconds):
            return seconds
    shown = value if len(value) <= 20 else value[:20] + "..."
    raise InvalidInput(f"the {name} header must be {what}, got {shown!r}")
