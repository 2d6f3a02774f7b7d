"""OpenTelemetry spans of requests and the batches they ran in, made only
for a streamer configured with ``tracing=True``.

Nothing here imports OpenTelemetry at module level, and nothing imports
this module's OpenTelemetry parts unless tracing is on: the engine runs
without the package, and a streamer with tracing off pays one flag test per
call and per batch. Spans go to whatever tracer provider the process has
set up (``opentelemetry.trace.set_tracer_provider``), as a library's spans
do; with none, the API's own no-op one takes them.

What is made, and where::

    web process                               where the batch runs (the model's thread,
                                              a worker process, a Redis worker)
    "POST /embed"  (the web layers)
      +- "parse"
      +- "queue wait"  <------ child -------- made when the batch has run, from the
      +- "in batch"    <------ child -------- request's context, sent with its input
      |       \\--- link --->  "batch <model>"  (one per batch; a root span, linked
      +- "respond"                             to each request span: fan-in)

A call made outside the web layers is traced the same way from whatever
span is current when it is submitted; with none, its batch has no link for
it and no per-request spans. Across processes the request's context travels
as a W3C ``traceparent`` with its input (the process backend's batch
message, the Redis backend's request entry, field ``tp``).

What a request the sampler leaves out costs (most requests, under a ratio
sampler): its request span, which the SDK makes without recording it (the
sampling decision is made there), made current while it is served, so that
spans made under it follow its decision. Nothing else: no ``parse`` or
``respond`` span, no ``queue wait`` or ``in batch`` span, no link, and a
batch whose every input was left out of the sample runs with no span at all
(a batch holding a call made with no span current still gets one, a root
span the sampler decides on). A sampled request gets every span above;
each costs CPU in the web process, so the sample is the knob (the docs'
Performance page, "What tracing costs").
"""

from __future__ import annotations

import re
import time
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Mapping, NamedTuple, Optional, Sequence, Tuple, TypeVar

from .. import shortcuts

if TYPE_CHECKING:
    from opentelemetry.trace import Span, SpanContext, Tracer

    from .span_recorder import Recorder

__all__ = [
    "TRACER_NAME",
    "CallTrace",
    "BatchFacts",
    "missing_api",
    "capture",
    "to_traceparent",
    "from_traceparent",
    "traced_run",
    "has_span",
    "silent",
    "request_span",
    "step",
    "mark_status",
    "Step",
]

#: The instrumentation scope of every span made here.
TRACER_NAME = "streamer_core"

R = TypeVar("R")

_tracer: Optional[Tracer] = None
# The tracer provider last seen, and its recorder (None: spans are made with
# its tracer): a process sets its global provider once.
_provider_seen: Any = None
_recorder_seen: Optional[Recorder] = None
# Whether the provider last seen is one whose spans never record: none set
# yet (the API's proxy), or the API's no-op provider.
_silent_seen = False
# OpenTelemetry's ``trace`` and ``context`` modules, imported on first use
# (an import statement costs a request a lookup each time it runs); set
# before any span is made (tracer()).
_trace: Any = None
_context: Any = None
# Where a recorder makes the spans: the context's key of the current span,
# and the span classes read from it without asking isinstance (span_recorder).
_span_key: Any = None
_span_types: Any = frozenset()
# Each endpoint's request span name and attributes, made once (a request
# left out of the sample costs little else); bounded, as a route may be a path.
_request_names: Dict[Tuple[str, str, str], Tuple[str, Mapping[str, str]]] = {}
_MOST_REQUEST_NAMES = 1024
# A W3C traceparent of version 00: version, trace id, span id, flags.
_TRACEPARENT = re.compile(r"00-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})")


class CallTrace(NamedTuple):
    """What a traced call carries to where its batch runs: the span context
    it was submitted in (a request span, or the caller's own), when it
    arrived, in nanoseconds since the epoch (the start of its queue wait),
    and whether its trace is recorded (the context's flag, read once). A
    context the sampler left out (``sampled`` false) says only that: its
    batch makes no span for it."""

    context: SpanContext
    arrived_ns: int
    sampled: bool


class BatchFacts(NamedTuple):
    """The attributes of one batch's span: the model's name, the backend,
    the worker that ran it and its device (as the ready log line names them)."""

    model: str
    backend: str
    worker: str
    device: str


def missing_api() -> Optional[str]:
    """Why tracing cannot be switched on here (OpenTelemetry's API is not
    installed), or ``None`` when it can."""
    try:
        import opentelemetry.trace  # noqa: F401
    except ImportError:
        return "OpenTelemetry is not installed: pip install 'streamer-core[otel]' (or opentelemetry-api)"
    return None


def _api() -> Tuple[Any, Any]:
    """OpenTelemetry's ``trace`` and ``context`` modules (imported once)."""
    global _trace, _context
    if _trace is None or _context is None:
        from opentelemetry import context, trace

        _trace, _context = trace, context
    return _trace, _context


def tracer() -> Tracer:
    """This library's tracer, from the global provider. Got once: before the
    application sets its provider, the API hands out a proxy that follows
    the provider set later."""
    global _tracer
    if _tracer is None:
        trace, _ = _api()
        _tracer = trace.get_tracer(TRACER_NAME, _version())
    return _tracer


def _version() -> Optional[str]:
    """The package's version, read without importing the package from here."""
    import sys

    return getattr(sys.modules.get(TRACER_NAME), "__version__", None)


def recorder() -> Optional[Recorder]:
    """The recorder of the process's tracer provider where it is the SDK's
    (:mod:`streamer_core.telemetry.span_recorder`: the same spans at a fraction of the
    SDK tracer's cost), else ``None``: spans are made with the provider's
    tracer. The SDK is never imported from here: a provider of the SDK's
    was made by code that imported it."""
    global _provider_seen, _recorder_seen, _silent_seen
    if _recorder_seen is not None:  # an SDK provider: a process's global provider is set once
        return _recorder_seen
    trace = _trace if _trace is not None else _api()[0]
    provider = trace.get_tracer_provider()
    if provider is not _provider_seen:
        import sys

        found = None
        if "opentelemetry.sdk.trace" in sys.modules and shortcuts.allowed("otel-spans"):
            from .span_recorder import recorder_for

            found = recorder_for(provider, _version())
            if found is not None:
                from .span_recorder import SPAN_KEY, SPAN_TYPES

                global _span_key, _span_types
                _span_key, _span_types = SPAN_KEY, SPAN_TYPES
        _provider_seen, _recorder_seen = provider, found
        _silent_seen = isinstance(provider, (trace.ProxyTracerProvider, trace.NoOpTracerProvider))
    return _recorder_seen


def silent() -> bool:
    """Whether no span made now would record: no tracer provider is set
    (the API hands out its proxy's no-op spans until one is) or the API's
    no-op provider is. Then a request is served and a batch run with no span
    of this library's at all: the spans would be no-ops, and what the
    call's context carries is the current span's either way. Looked at on
    each request and batch: a provider set later is seen at once."""
    return recorder() is None and _silent_seen


def capture() -> Optional[CallTrace]:
    """The current span's context and the time now, for a call being
    submitted; ``None`` when no span is current. A span the sampler left out
    is captured too (:attr:`CallTrace.sampled` false): its call costs its
    batch no link and no spans, and a batch of such calls alone no span."""
    if _recorder_seen is not None:  # the SDK's: the span read as its recorder put it there
        span = _context.get_current().get(_span_key)
        context = (span if type(span) in _span_types else _trace.get_current_span()).get_span_context()
        # A SpanContext is the tuple (trace id, span id, is remote, flags, state, is valid): checked by recorder_for.
        valid, flags = context[5], context[3]
    else:
        trace = _trace if _trace is not None else _api()[0]
        context = trace.get_current_span().get_span_context()
        valid, flags = context.is_valid, context.trace_flags
    if not valid:
        return None
    # Made as CallTrace(...) makes it (a named tuple), in a third of its time.
    made: CallTrace = tuple.__new__(CallTrace, (context, time.time_ns(), bool(flags & 1)))
    return made


def to_traceparent(call: CallTrace) -> str:
    """The call's context as a W3C ``traceparent`` header value."""
    context = call.context
    return f"00-{context.trace_id:032x}-{context.span_id:016x}-{int(context.trace_flags):02x}"


def from_traceparent(value: Any, arrived_ns: int) -> Optional[CallTrace]:
    """A call's trace from a ``traceparent`` that crossed a process or
    Redis (``str`` or ``bytes``); ``None`` for anything that does not parse
    as one: it came from outside, and a bad one only loses the links. The
    usual version (00) is read here, in a fraction of the propagator's time
    (each input of a batch carries one); others go to the propagator."""
    if isinstance(value, bytes):
        try:
            value = value.decode("ascii")
        except UnicodeDecodeError:
            return None
    if not isinstance(value, str):
        return None
    trace, _ = _api()
    found = _TRACEPARENT.fullmatch(value)
    if found is not None:
        trace_id, span_id, flags = found.groups()
        context = trace.SpanContext(
            int(trace_id, 16), int(span_id, 16), is_remote=True, trace_flags=trace.TraceFlags(int(flags, 16))
        )
    else:
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        extracted = TraceContextTextMapPropagator().extract({"traceparent": value})
        context = trace.get_current_span(extracted).get_span_context()
    if not context.is_valid:
        return None
    return CallTrace(context, arrived_ns, bool(context.trace_flags & 1))


def has_span(calls: Sequence[Optional[CallTrace]]) -> bool:
    """Whether a batch of inputs of these calls gets a span: unless every
    one was submitted in a span the sampler left out (see :func:`traced_run`),
    or no span would record (:func:`silent`)."""
    if silent():
        return False
    for call in calls:
        if call is None or call.sampled:
            return True
    return not calls


def _distinct(calls: Sequence[Optional[CallTrace]]) -> Dict[Tuple[int, int], Tuple[CallTrace, int]]:
    """Each sampled request of a batch once (several of its inputs may be in
    it), with how many of its inputs the batch holds, by ``(trace_id, span_id)``."""
    found: Dict[Tuple[int, int], Tuple[CallTrace, int]] = {}
    for call in calls:
        if call is None or not call.sampled:
            continue
        key = (call.context.trace_id, call.context.span_id)
        seen = found.get(key)
        found[key] = (call, 1) if seen is None else (seen[0], seen[1] + 1)
    return found


def traced_run(
    run: Callable[[], R], facts: BatchFacts, calls: Sequence[Optional[CallTrace]], cost: float
) -> Tuple[R, float]:
    """Run one batch (``run()``, the model call) inside its span, and make
    each request's ``queue wait`` and ``in batch`` spans once it has run;
    return what ``run()`` returned and the seconds it took. ``calls``: the
    trace of each input of the batch (``None`` where its call had none);
    ``cost``: the batch's cost by the streamer's ``batch_cost`` rule. The
    batch span is current while the model runs, so spans the model makes
    are its children. A batch whose every input was submitted in a span
    the sampler left out has no span: nobody will look for it."""
    if not has_span(calls):
        started = time.monotonic()
        result = run()
        return result, time.monotonic() - started
    requests = _distinct(calls)
    trace, otel_context = _api()
    attributes: Dict[str, Any] = {
        "streamer.model": facts.model,
        "streamer.backend": facts.backend,
        "streamer.worker": facts.worker,
        "streamer.device": facts.device,
        "streamer.batch.size": len(calls),
        "streamer.batch.cost": float(cost),
    }
    links = [trace.Link(call.context) for call, _ in requests.values()]
    started_ns = time.time_ns()
    started = time.monotonic()
    name, root, fast = f"batch {facts.model}", otel_context.Context(), recorder()
    if fast is not None:
        batch = fast.start(name, root, attributes, links, started_ns)
    else:
        batch = tracer().start_span(name, context=root, links=links, attributes=attributes, start_time=started_ns)
    token = otel_context.attach(trace.set_span_in_context(batch))
    try:
        result = run()
    except BaseException as exc:
        batch.record_exception(exc)
        batch.set_status(trace.StatusCode.ERROR)
        raise
    finally:
        seconds = time.monotonic() - started
        otel_context.detach(token)
        if fast is not None:
            fast.note(batch, "streamer.batch.model_seconds", seconds)
        else:
            batch.set_attribute("streamer.batch.model_seconds", seconds)
        ended_ns = started_ns + int(seconds * 1e9)
        batch.end(ended_ns)
    _request_spans(requests, batch.get_span_context(), len(calls), started_ns, ended_ns)
    return result, seconds


def _request_spans(
    requests: Dict[Tuple[int, int], Tuple[CallTrace, int]],
    batch: SpanContext,
    size: int,
    started_ns: int,
    ended_ns: int,
) -> None:
    """Each request's view of the batch, as children of its own span: how
    long it waited for the batch, and the batch's run, linked to its span."""
    trace, _ = _api()
    fast = recorder()
    if fast is not None:
        links = [trace.Link(batch)]  # the same for each (a recorder's spans keep links as given)
        for call, inputs in requests.values():
            waited_from = call.arrived_ns if call.arrived_ns < started_ns else started_ns
            fast.child("queue wait", call.context, None, (), waited_from).end(started_ns)
            attributes = {"streamer.batch.size": size, "streamer.request.inputs": inputs}
            fast.child("in batch", call.context, attributes, links, started_ns).end(ended_ns)
        return
    made = tracer()
    for call, inputs in requests.values():
        waited_from = min(call.arrived_ns, started_ns)
        attributes = {"streamer.batch.size": size, "streamer.request.inputs": inputs}
        links = [trace.Link(batch)]
        parent = trace.set_span_in_context(trace.NonRecordingSpan(call.context))
        made.start_span("queue wait", context=parent, start_time=waited_from).end(started_ns)
        made.start_span("in batch", context=parent, links=links, start_time=started_ns, attributes=attributes).end(
            ended_ns
        )


class Step:
    """A span made current for a ``with`` block (a request, its ``parse``
    and ``respond``), in the context current as it starts or in ``within``
    (a request's, for its steps: what is current then)."""

    __slots__ = ("span", "context", "_holds", "_token")

    def __init__(self, span: Span, within: Any = None, holds: bool = False) -> None:
        self.span = span
        self.context: Any = within
        self._holds = holds  # ``within`` holds the span already
        self._token: Any = None

    def __enter__(self) -> Span:
        if not self._holds:
            self.context = _trace.set_span_in_context(self.span, self.context)  # loaded: the span was made
        self._token = _context.attach(self.context)
        return self.span

    def __exit__(self, kind: Any, exc: Optional[BaseException], tb: Any) -> None:
        _context.detach(self._token)
        if exc is not None:
            self.span.record_exception(exc)
            self.span.set_status(_trace.StatusCode.ERROR)
        self.span.end()


def request_span(method: str, route: str, model: str) -> Step:
    """The span of one request to a batched endpoint, named by its method
    and route (``"POST /embed"``), as a child of any span current (a web
    framework's own instrumentation). Its attributes are given as it starts,
    for a sampler that decides by them."""
    named = _request_names.get((method, route, model))
    if named is None:
        attributes = {"http.request.method": method, "http.route": route, "streamer.model": model}
        named = (f"{method} {route}", MappingProxyType(attributes))
        if len(_request_names) < _MOST_REQUEST_NAMES:
            _request_names[(method, route, model)] = named
    fast = _recorder_seen if _recorder_seen is not None else recorder()
    if fast is not None:
        span, context = fast.start_current(named[0], named[1])
        return Step(span, context, True)
    made = _tracer if _tracer is not None else tracer()
    return Step(made.start_span(named[0], attributes=named[1]))


def step(name: str, request: Step) -> Step:
    """A span for one step of a request, a child of its span, current in its
    context (what is current while it is served); made by the recorder that
    made the request's span, where one did."""
    made_by: Optional[Recorder] = getattr(request.span, "_recorder", None)
    if made_by is not None:
        return Step(made_by.child(name, request.span.get_span_context()), request.context)
    return Step(tracer().start_span(name, context=request.context), request.context)


def mark_status(span: Span, status: int, error: BaseException) -> None:
    """Record on a request's span the error status it is answered with, and
    the error; a 5xx marks the span failed (a 4xx is the client's)."""
    trace, _ = _api()
    span.set_attribute("http.response.status_code", status)
    span.set_attribute("error.type", type(error).__name__)
    if status >= 500:
        span.record_exception(error)
        span.set_status(trace.StatusCode.ERROR, str(error))


def batch_trace(traces: Sequence[Optional[CallTrace]]) -> List[Optional[str]]:
    """The traces of a batch's inputs as ``traceparent`` values, to send."""
    return [None if call is None else to_traceparent(call) for call in traces]
