"""The current OpenTelemetry context, read and set in a fraction of the
API's calls, for the spans a traced request makes (:mod:`streamer_core.tracing`).

A traced request makes three spans current in turn (the request, then its
``parse`` and its ``respond`` step) and reads the current span a few times
more. Through the API each of those is a chain of three or four Python
calls (``set_span_in_context``, ``set_value``, ``get_current``, the runtime
context's ``attach``...) around one ``ContextVar`` operation: together some
forty calls a request, a sixth of what tracing costs it. Where the API's
runtime context is its default one, which keeps the current context in a
``ContextVar``, that variable is read and set here directly; the span goes
under the API's own key. Both are private to the API, so they are checked
once, on first use (:func:`_found`): where the API keeps its context in
another way (``OTEL_PYTHON_CONTEXT`` names another runtime, or a later API
moves it), the API's functions are used, and nothing changes but the cost.

Imported only where tracing is on: it imports OpenTelemetry's API.
"""

from __future__ import annotations

import logging
from contextvars import ContextVar
from typing import Any, Callable, Optional

from opentelemetry import context as _api_context
from opentelemetry import trace as _api_trace
from opentelemetry.context import Context
from opentelemetry.trace import INVALID_SPAN, Span

__all__ = ["current", "current_span", "with_span", "attach", "detach"]

logger = logging.getLogger("streamer_core")


def _found() -> Optional[tuple[ContextVar[Context], str]]:
    """The API's ``ContextVar`` of the current context and its key of the
    current span, where setting that variable and that key is what its own
    ``attach`` and ``set_span_in_context`` do (tried once, here); else ``None``."""
    runtime = getattr(_api_context, "_RUNTIME_CONTEXT", None)
    var = getattr(runtime, "_current_context", None)
    key = getattr(getattr(_api_trace, "propagation", None), "_SPAN_KEY", None)
    if not isinstance(var, ContextVar) or not isinstance(key, str):
        return None
    span = _api_trace.NonRecordingSpan(_api_trace.SpanContext(1, 2, False))
    made = _api_trace.set_span_in_context(span)
    if made != Context({**var.get(), key: span}):
        return None
    token = var.set(made)
    try:
        seen = _api_context.get_current() is made and _api_trace.get_current_span() is span
    finally:
        var.reset(token)
    return (var, key) if seen and _api_context.get_current() is not made else None


class _Direct:
    """The context functions on the API's ``ContextVar`` and span key."""

    def __init__(self, var: ContextVar[Context], key: str) -> None:
        self.current = var.get
        self.attach = var.set
        self._var, self._key = var, key
        self._span_types: set[type] = set()

    def detach(self, token: Any) -> None:
        """Make the context current before ``token``'s attach current again;
        a token of another context is logged, as the API's ``detach`` logs it."""
        try:
            self._var.reset(token)
        except Exception:
            logger.exception("Failed to detach context")

    def current_span(self, context: Optional[Context] = None) -> Span:
        """The span current in ``context`` (the current context where
        ``None``), as ``opentelemetry.trace.get_current_span`` gives it."""
        span = (context if context is not None else self._var.get()).get(self._key)
        if type(span) in self._span_types:
            return span  # type: ignore[return-value]  # a Span's type, seen before
        if isinstance(span, Span):  # an ABC's check, a Python call: made once a type
            self._span_types.add(type(span))
            return span
        return INVALID_SPAN

    def with_span(self, span: Span, context: Optional[Context] = None) -> Context:
        """``context`` (the current one where ``None``) with ``span`` as its
        current span, as ``opentelemetry.trace.set_span_in_context`` makes it."""
        return Context({**(context if context is not None else self._var.get()), self._key: span})


_found_here = _found()
_direct = None if _found_here is None else _Direct(*_found_here)

#: The current context.
current: Callable[[], Context] = _api_context.get_current if _direct is None else _direct.current
#: Make a context current; returns the token to give :func:`detach`.
attach: Callable[[Context], Any] = _api_context.attach if _direct is None else _direct.attach
#: Make current again the context current before an :func:`attach` (its token).
detach: Callable[[Any], None] = _api_context.detach if _direct is None else _direct.detach
#: The span current in a context (the current one where ``None``).
current_span: Callable[..., Span] = _api_trace.get_current_span if _direct is None else _direct.current_span
#: A context (the current one where ``None``) with a span as its current span.
with_span: Callable[..., Context] = _api_trace.set_span_in_context if _direct is None else _direct.with_span
