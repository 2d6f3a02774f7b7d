"""Spans of requests and batches at a fraction of what the SDK's tracer
costs, for a process whose tracer provider is OpenTelemetry's SDK.

The SDK's ``Tracer.start_span`` and ``Span.end`` cost more a span than a
stubbed request costs altogether, and a request recorded whole makes five
spans and its share of a sixth (the docs' Performance page, "What tracing
costs"). Almost none of that is what a span
*is*: it is validating attributes already known to be good, a lock, a
bounded list and a bounded mapping made for every span, and a fresh copy
made at its end. A :class:`Recorder` makes spans as the SDK's tracer does,
from the same provider's parts, and hands them to the same span processors
(so to the same exporters), without that machinery:

* the provider's **sampler** decides, as it would for the SDK's tracer.
  Where the sampler's own description makes its answer known, it is not
  asked: ``AlwaysOnSampler`` records everything; ``ParentBased`` with its
  usual delegates follows a span's parent, and decides a root by its root
  sampler (AlwaysOn, AlwaysOff, or ``TraceIdRatioBased`` by the trace id,
  its bound checked once against the sampler itself). Any other sampler is
  asked for every span;
* the provider's **id generator**, **resource** and **span limits** (for
  attributes set by code other than the streamer's: values are checked
  as the SDK checks them);
* the provider's **span processors**: ``on_start`` with the live span (a
  processor may set attributes on it, as the baggage processor does),
  then, at its end, ``on_end`` with the finished span. A hook whose body is
  empty (the SDK's batch and simple processors' ``on_start``) is not
  called; under the SDK's synchronous multi-processor, each processor's
  ``on_end`` is called in turn, as it calls them, but for the SDK's own
  batch processor, whose queue the span is put on as its ``on_end`` would
  put it, without a system call each (:mod:`streamer_core.telemetry.span_processors`).

A span is an :class:`opentelemetry.trace.Span` while it runs and the SDK's
:class:`~opentelemetry.sdk.trace.ReadableSpan` once it has ended, as the
SDK's own spans are. It is made by the streamer's code only; code under it
sees an ordinary current span (``set_attribute``, ``add_event``,
``record_exception``, ``set_status``, children of it made by the SDK's
tracer). Not counted: the SDK's own metrics of its spans
(``OTEL_PYTHON_SDK_INTERNAL_METRICS_ENABLED``).

:func:`recorder_for` checks once per process that a span made this way reads
back as the SDK's readers expect (a later SDK may keep its fields
elsewhere); where it does not, or where the provider is not the SDK's, the
streamer makes its spans with the provider's tracer, as any library does.
"""

from __future__ import annotations

import logging
import random as _random_ids
import re
import time
import traceback
from typing import TYPE_CHECKING, Any, Callable, Dict, Mapping, Optional, Sequence, Tuple

from opentelemetry import trace
from opentelemetry.attributes import BoundedAttributes
from opentelemetry.context import Context, get_current
from opentelemetry.sdk.trace import (
    Event,
    ReadableSpan,
    SpanLimits,
    SpanProcessor,
    SynchronousMultiSpanProcessor,
    TracerProvider,
)
from opentelemetry.sdk.trace import Span as SdkSpan
from opentelemetry.sdk.util import BoundedList
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import Link, SpanContext, SpanKind, Status, StatusCode, TraceFlags, TraceState
from opentelemetry.trace.span import DEFAULT_TRACE_STATE

from .span_processors import does_nothing, ender

if TYPE_CHECKING:
    from opentelemetry.sdk.trace.sampling import Sampler

__all__ = ["Recorder", "recorder_for", "SPAN_KEY", "SPAN_TYPES"]

logger = logging.getLogger("streamer_core")

_SAMPLED = TraceFlags(TraceFlags.SAMPLED)
# W3C Trace Context level 2's "random trace id" flag, set by SDKs that know it.
_RANDOM = getattr(TraceFlags, "RANDOM_TRACE_ID", 0)
_UNSET = Status(StatusCode.UNSET)
#: The key under which the API's context holds the current span, as
#: ``set_span_in_context`` puts it there (its name is the API's own).
SPAN_KEY = next(iter(trace.set_span_in_context(trace.INVALID_SPAN, Context())))
# A span's flags by whether it is sampled, then whether its trace id is random.
_FLAGS = (
    (TraceFlags(TraceFlags.DEFAULT), TraceFlags(TraceFlags.DEFAULT | _RANDOM)),
    (TraceFlags(TraceFlags.SAMPLED), TraceFlags(TraceFlags.SAMPLED | _RANDOM)),
)
# The samplers whose decisions are known without asking them, as the SDK's
# own samplers describe themselves: AlwaysOn records everything; ParentBased
# with these delegates follows a span's parent, and leaves a root to its
# root sampler (AlwaysOn, AlwaysOff, or a ratio by the trace id).
_ALWAYS_ON = "AlwaysOnSampler"
_FOLLOWS_PARENTS = (
    "remoteParentSampled:AlwaysOnSampler",
    "remoteParentNotSampled:AlwaysOffSampler",
    "localParentSampled:AlwaysOnSampler",
    "localParentNotSampled:AlwaysOffSampler",
)
_ROOT = re.compile(r"ParentBased\{root:(AlwaysOnSampler|AlwaysOffSampler|TraceIdRatioBased\{([^{}]*)\}),")


class _Recording(trace.Span, ReadableSpan):
    """One span: live (an API span) until :meth:`end`, then the finished
    span the processors get (a ``ReadableSpan``), as the SDK's span is both.
    Only what the SDK's readers read is kept; a ``ReadableSpan`` reads
    what is not set here from the class (no events, kind ``INTERNAL``)."""

    _kind = SpanKind.INTERNAL
    _instrumentation_info = None
    _events: Sequence[Event] = ()
    _status = _UNSET

    def __init__(
        self,
        recorder: Recorder,
        name: str,
        context: SpanContext,
        parent: Optional[SpanContext],
        attributes: Any,
        links: Sequence[Link],
        start_ns: int,
    ) -> None:
        # ReadableSpan's fields, set here rather than through its __init__,
        # which sets every one of them (checked once: recorder_for).
        self._name = name
        self._context = context
        self._parent = parent
        self._attributes = attributes
        self._links = links
        self._start_time = start_ns
        self._end_time: Optional[int] = None
        self._resource = recorder.resource
        self._instrumentation_scope = recorder.scope
        self._recorder = recorder

    # -- the API span ----------------------------------------------------------

    def get_span_context(self) -> SpanContext:
        return self._context  # type: ignore[return-value]  # never None: a recorder gives every span one

    def is_recording(self) -> bool:
        return self._end_time is None

    def _ended(self, what: str) -> bool:
        if self._end_time is None:
            return False
        logger.warning("%s on the ended span %r", what, self._name)
        return True

    def _bounded(self) -> BoundedAttributes:
        """The attributes as the SDK keeps a span's, for values set by code
        other than the streamer's: checked, and held to the provider's limits."""
        if not isinstance(self._attributes, BoundedAttributes):
            limits = self._recorder.limits
            self._attributes = BoundedAttributes(
                limits.max_span_attributes,
                self._attributes,
                immutable=False,
                max_value_len=limits.max_span_attribute_length,
            )
        return self._attributes

    def set_attribute(self, key: str, value: Any) -> None:
        if not self._ended("Setting an attribute"):
            self._bounded()[key] = value

    def set_attributes(self, attributes: Mapping[str, Any]) -> None:
        if not self._ended("Setting attributes"):
            bounded = self._bounded()
            for key, value in attributes.items():
                bounded[key] = value

    def add_event(self, name: str, attributes: Any = None, timestamp: Optional[int] = None) -> None:
        if self._ended("Adding an event"):
            return
        limits = self._recorder.limits
        checked = BoundedAttributes(
            limits.max_event_attributes, attributes, immutable=True, max_value_len=limits.max_attribute_length
        )
        events = list(self._events)
        if limits.max_events is None or len(events) < limits.max_events:
            self._events = events + [Event(name, checked, timestamp)]

    def add_link(self, context: SpanContext, attributes: Any = None) -> None:
        if self._ended("Adding a link") or not context.is_valid:
            return
        limits = self._recorder.limits
        if limits.max_links is None or len(self._links) < limits.max_links:
            checked = BoundedAttributes(
                limits.max_link_attributes, attributes, immutable=True, max_value_len=limits.max_attribute_length
            )
            self._links = list(self._links) + [Link(context, checked)]

    def update_name(self, name: str) -> None:
        if not self._ended("Renaming"):
            self._name = name

    def set_status(self, status: Any, description: Optional[str] = None) -> None:
        """As the SDK's: ``OK`` is final, ``UNSET`` changes nothing."""
        if self._ended("Setting the status") or self._status.status_code is StatusCode.OK:
            return
        if isinstance(status, Status):
            if status.status_code is not StatusCode.UNSET:
                self._status = status
        elif status is not StatusCode.UNSET:
            self._status = Status(status, description)

    def record_exception(
        self, exception: BaseException, attributes: Any = None, timestamp: Optional[int] = None, escaped: bool = False
    ) -> None:
        """An ``exception`` event with the attributes OpenTelemetry's
        conventions name (and the SDK's spans record)."""
        kind = type(exception)
        module = kind.__module__
        recorded: Dict[str, Any] = {
            "exception.type": f"{module}.{kind.__qualname__}" if module and module != "builtins" else kind.__qualname__,
            "exception.message": str(exception),
            "exception.stacktrace": "".join(traceback.format_exception(kind, exception, exception.__traceback__)),
            "exception.escaped": str(escaped),
        }
        if attributes:
            recorded.update(attributes)
        self.add_event("exception", recorded, timestamp)

    def end(self, end_time: Optional[int] = None) -> None:
        if self._end_time is not None:
            self._ended("Ending")
            return
        self._end_time = end_time if end_time is not None else time.time_ns()
        recorder = self._recorder
        if recorder._ends and recorder._on_ending is not None:
            recorder._on_ending(self)
        if getattr(recorder.processor, "_span_processors", None) is not recorder._processors:
            recorder._look_at_processors()  # one added since the span started
        for on_end in recorder._enders:
            on_end(self)

    # The API span's __exit__ ends it; as the SDK's does, an error leaving
    # the block is recorded on it first.
    def __exit__(self, kind: Any, exc: Optional[BaseException], tb: Any) -> None:
        if exc is not None and self.is_recording():
            self.record_exception(exc, escaped=True)
            self.set_status(Status(StatusCode.ERROR, f"{type(exc).__name__}: {exc}"))
        super().__exit__(kind, exc, tb)


class Recorder:
    """Makes spans for one SDK tracer provider (see the module's docstring)."""

    def __init__(self, provider: TracerProvider, processor: SpanProcessor, version: Optional[str]) -> None:
        self.sampler: Sampler = provider.sampler
        self.ids = provider.id_generator
        self.resource = provider.resource
        self.limits: SpanLimits = getattr(provider, "_span_limits", None) or SpanLimits()
        self.scope = InstrumentationScope("streamer_core", version)
        self.processor = processor
        description = self.sampler.get_description()
        #: Every span is recorded without asking (AlwaysOn).
        self.always = description == _ALWAYS_ON
        #: A span with a parent follows it without asking (ParentBased, the usual delegates).
        self.by_parent = description.startswith("ParentBased{") and all(
            part in description for part in _FOLLOWS_PARENTS
        )
        #: A sampled parent's child is sampled without asking.
        self.children_follow = self.always or self.by_parent
        #: Under ParentBased, the bound below which a root's trace id (its low
        #: 64 bits) is recorded without asking; None: ask.
        self.root_bound = _root_bound(self.sampler, description) if self.by_parent else None
        is_random = getattr(self.ids, "is_trace_id_random", None)
        self.random_ids = bool(_RANDOM and is_random is not None and is_random())
        # The flags of a root left out of the sample.
        self._left_out = _FLAGS[False][self.random_ids]
        # The SDK's hook as a span ends, before on_end (1.3x: private, and absent before).
        self._on_ending = getattr(processor, "_on_ending", None)
        self._processors: Any = None
        self._starts = self._ends = True
        #: What is called with each ended span: the processor's on_end, or
        #: where it is the SDK's synchronous multi-processor (whose on_end calls
        #: each of its processors' in turn), theirs, so.
        self._enders: Tuple[Callable[[Any], None], ...] = (processor.on_end,)

    def _look_at_processors(self) -> None:
        """Whether some processor does something as a span starts, and as it
        ends before ``on_end``: where every one's ``on_start`` (or
        ``_on_ending``) has an empty body, as the SDK's batch and simple
        processors' have, nobody is called. Looked at again when a
        processor is added (the provider's multi-processor replaces its
        tuple of them)."""
        processors = getattr(self.processor, "_span_processors", None)
        if processors is None:  # a processor of another shape: call it
            self._starts = self._ends = True
            self._enders = (self.processor.on_end,)
        else:
            self._starts = not all(does_nothing(getattr(p, "on_start", None)) for p in processors)
            self._ends = not all(does_nothing(getattr(p, "_on_ending", None)) for p in processors)
            direct = type(self.processor) is SynchronousMultiSpanProcessor
            self._enders = tuple(ender(p) for p in processors) if direct else (self.processor.on_end,)
        # Last: a span started on another thread meanwhile sees the tuple only
        # with what was worked out of it.
        self._processors = processors

    def start(
        self,
        name: str,
        context: Optional[Context],
        attributes: Optional[Mapping[str, Any]] = None,
        links: Sequence[Link] = (),
        start_ns: Optional[int] = None,
    ) -> trace.Span:
        """A span, as the SDK tracer's ``start_span(name, context, ...)``
        makes it: a child of the span current in ``context`` (the current
        context where ``None``; an empty one makes a root), sampled as the
        sampler decides; not sampled, a ``NonRecordingSpan`` that carries
        the decision to its children."""
        parent: Optional[SpanContext] = trace.get_current_span(context).get_span_context()
        return self._start(name, parent, context, attributes, links, start_ns)

    def start_current(self, name: str, attributes: Optional[Mapping[str, Any]] = None) -> Tuple[trace.Span, Context]:
        """``start(name, None, attributes)``, and the current context with
        the span in it (what ``set_span_in_context`` makes of it), to attach:
        a request's span, made for every request, sampled or not. A root
        the sampler decides by its trace id alone and leaves out (most
        requests under a ratio sampler) is made here with nothing else done."""
        current = get_current()
        held: Any = current.get(SPAN_KEY)
        if held is None and self.root_bound is not None:
            root_id = self.ids.generate_trace_id()
            if root_id & _LOW_64 >= self.root_bound:
                left_out = _span_context(root_id, self.ids.generate_span_id(), self._left_out, None)
                span: trace.Span = trace.NonRecordingSpan(left_out)
            else:
                span = self._start(name, trace.INVALID_SPAN_CONTEXT, current, attributes, (), None, root_id)
        else:
            parent = (held if type(held) in SPAN_TYPES else trace.get_current_span(current)).get_span_context()
            span = self._start(name, parent, current, attributes, (), None)
        values = dict(current)
        values[SPAN_KEY] = span
        return span, Context(values)

    def _start(
        self,
        name: str,
        parent: Optional[SpanContext],
        context: Optional[Context],
        attributes: Optional[Mapping[str, Any]],
        links: Sequence[Link],
        start_ns: Optional[int],
        root_id: Optional[int] = None,
    ) -> trace.Span:
        """:meth:`start` under ``parent``, the span context current in
        ``context``; ``root_id``: the trace id drawn for it already, where
        it is a root."""
        assert parent is not None  # an API span's context is never None
        if parent.is_valid:
            trace_id, random = parent.trace_id, parent.trace_flags & _RANDOM
        else:
            parent, random = None, self.random_ids
            trace_id = self.ids.generate_trace_id() if root_id is None else root_id
        if self.always or (self.by_parent and (parent is not None or self.root_bound is not None)):
            if self.always:
                sampled = True
            elif parent is not None:
                sampled = bool(parent.trace_flags & _SAMPLED)
            else:
                sampled = trace_id & _LOW_64 < self.root_bound  # type: ignore[operator]  # not None here
            recorded, state = sampled, None if parent is None else parent.trace_state
            given: Any = dict(attributes) if attributes and sampled else {}
        else:
            result = self.sampler.should_sample(context, trace_id, name, SpanKind.INTERNAL, attributes, links)
            decision: Any = result.decision  # Decision's methods carry no types
            sampled, recorded, state = decision.is_sampled(), decision.is_recording(), result.trace_state
            given = dict(result.attributes) if recorded else {}
        span_context = _span_context(trace_id, self.ids.generate_span_id(), _FLAGS[sampled][bool(random)], state)
        if not recorded:
            return trace.NonRecordingSpan(span_context)
        return self._begin(name, span_context, parent, given, links, start_ns, context)

    def child(
        self,
        name: str,
        parent: SpanContext,
        attributes: Optional[Dict[str, Any]] = None,
        links: Sequence[Link] = (),
        start_ns: Optional[int] = None,
    ) -> trace.Span:
        """A span under ``parent``, a span context the sampler recorded (a
        request's, a batch's): what :meth:`start` makes in a context
        holding it, without asking the sampler again where its decision is
        known (:attr:`children_follow`)."""
        trace_id, _, _, flags, state, _ = parent  # a SpanContext is this tuple (checked: recorder_for)
        if not (self.children_follow and flags & _SAMPLED):
            return self.start(
                name, trace.set_span_in_context(trace.NonRecordingSpan(parent)), attributes, links, start_ns
            )
        # The ids are valid ones (the parent's, and one from the id generator):
        # made as SpanContext makes it, without checking them again.
        context = tuple.__new__(SpanContext, (trace_id, self.ids.generate_span_id(), False, flags, state, True))
        return self._begin(name, context, parent, attributes if attributes is not None else {}, links, start_ns)

    @staticmethod
    def note(span: trace.Span, key: str, value: Any) -> None:
        """Set an attribute of the streamer's own (a value known to be valid)
        on a span: on one of a recorder's, without checking it again."""
        if isinstance(span, _Recording) and type(span._attributes) is dict:
            span._attributes[key] = value
        else:
            span.set_attribute(key, value)

    def _begin(
        self,
        name: str,
        context: SpanContext,
        parent: Optional[SpanContext],
        attributes: Any,
        links: Sequence[Link],
        start_ns: Optional[int],
        parent_context: Optional[Context] = None,
    ) -> _Recording:
        limit = self.limits.max_links
        if limit is not None and len(links) > limit:  # as the SDK keeps them, the rest counted as dropped
            links = BoundedList.from_seq(limit, links)
        span = _Recording(
            self, name, context, parent, attributes, links, time.time_ns() if start_ns is None else start_ns
        )
        if getattr(self.processor, "_span_processors", None) is not self._processors:
            self._look_at_processors()
        if self._starts:
            if parent_context is None and parent is not None:
                parent_context = trace.set_span_in_context(trace.NonRecordingSpan(parent))
            self.processor.on_start(span, parent_context=parent_context)  # type: ignore[arg-type]
        return span


_LOW_64 = (1 << 64) - 1
_LOW_128 = (1 << 128) - 1
# The spans a context may hold that are the API's spans without asking
# (``isinstance`` of the API's abstract Span, a tenth of a request's tracing).
SPAN_TYPES = frozenset({trace.NonRecordingSpan, _Recording, SdkSpan})


def _span_context(trace_id: int, span_id: int, flags: TraceFlags, state: Optional[TraceState]) -> SpanContext:
    """``SpanContext(trace_id, span_id, False, flags, state)``, made without
    its checks where the ids are valid (an id generator's are)."""
    if 0 < trace_id <= _LOW_128 and 0 < span_id <= _LOW_64:
        made: SpanContext = tuple.__new__(
            SpanContext, (trace_id, span_id, False, flags, DEFAULT_TRACE_STATE if state is None else state, True)
        )
        return made
    return SpanContext(trace_id, span_id, False, flags, state)  # an application's generator gave an invalid id


def _root_bound(sampler: Any, description: str) -> Optional[int]:
    """The bound below which ``sampler`` (a ParentBased one) records a root
    span by its trace id's low 64 bits, where its root sampler is the SDK's
    AlwaysOn, AlwaysOff or TraceIdRatioBased, and it decides so for trace ids
    about that bound and a few more (asked once, here); else ``None``."""
    from opentelemetry.context import Context
    from opentelemetry.sdk.trace.sampling import TraceIdRatioBased

    root = _ROOT.match(description)
    if root is None:
        return None
    if root.group(1) == "AlwaysOnSampler":
        bound = _LOW_64 + 1
    elif root.group(1) == "AlwaysOffSampler":
        bound = 0
    else:
        try:
            bound = TraceIdRatioBased.get_bound_for_rate(float(root.group(2)))
        except (AttributeError, TypeError, ValueError):  # an SDK that words or computes it otherwise
            return None
    picked = _random_ids.Random(bound)
    ids = [0, 1, _LOW_64, _LOW_64 + 1, *(picked.getrandbits(128) for _ in range(16))]
    ids += [
        high << 64 | (bound + step) for high in (0, 12345) for step in (-2, -1, 0, 1) if 0 <= bound + step <= _LOW_64
    ]
    for trace_id in ids:
        expected = sampler.should_sample(Context(), trace_id, "check").decision.is_sampled()
        if expected != (trace_id & _LOW_64 < bound):
            return None
    return bound


def _reads_back(recorder: Recorder) -> bool:
    """Whether a span made here reads back, through the properties the SDK's
    processors and exporters read, as what was given: the fields are
    ``ReadableSpan``'s own (set directly, for speed), which a later SDK may
    keep elsewhere."""
    context = SpanContext(1, 2, False, _SAMPLED)
    parent = SpanContext(1, 3, False, _SAMPLED)
    # A child's context is made as SpanContext makes one, from its fields in order.
    made = tuple.__new__(SpanContext, (1, 2, False, _SAMPLED, context.trace_state, True))
    if tuple(context) != tuple(made) or (made.trace_id, made.span_id, made.trace_flags, made.is_valid) != (
        1, 2, _SAMPLED, True
    ):  # fmt: skip
        return False
    link = Link(SpanContext(4, 5, False, _SAMPLED))
    span = _Recording(recorder, "check", context, parent, {"a": 1}, [link], 10)
    if trace.get_current_span(Context({SPAN_KEY: span})) is not span:  # a context as start_current makes it
        return False
    span._end_time = 20
    try:
        return (
            span.name == "check"
            and span.context == context
            and span.get_span_context() == context
            and span.parent == parent
            and dict(span.attributes or {}) == {"a": 1}
            and list(span.links) == [link]
            and list(span.events) == []
            and span.kind is SpanKind.INTERNAL
            and span.status.status_code is StatusCode.UNSET
            and (span.start_time, span.end_time) == (10, 20)
            and span.resource is recorder.resource
            and span.instrumentation_scope is recorder.scope
            and span.dropped_attributes == span.dropped_links == span.dropped_events == 0
            and isinstance(span.to_json(), str)
        )
    except Exception:  # a property that reads a field this class does not set
        return False


_checked: Dict[bool, bool] = {}


def recorder_for(provider: Any, version: Optional[str]) -> Optional[Recorder]:
    """A recorder for ``provider`` where it is the SDK's and spans made here
    read back as the SDK's do (checked once a process); ``None`` otherwise:
    the provider's own tracer is to be used."""
    processor = getattr(provider, "_active_span_processor", None)
    if not isinstance(provider, TracerProvider) or processor is None:
        return None
    recorder = Recorder(provider, processor, version)
    if not _checked.setdefault(True, _reads_back(recorder)):
        logger.info("tracing: this OpenTelemetry SDK's spans are made through its tracer (slower)")
        return None
    return recorder
