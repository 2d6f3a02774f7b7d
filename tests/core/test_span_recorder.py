"""The span recorder (``streamer_core.telemetry.span_recorder``): spans made without
the SDK tracer's per-span machinery, from a provider's own sampler, ids,
resource, limits and processors. Each test gives it an SDK provider of its
own, with a real exporter; that the streamer's spans come out the same
through it as through the SDK's tracer is tests/flask/test_tracing.py's
and tests/core/test_tracing.py's."""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, List, Optional, Sequence

import pytest

pytest.importorskip("opentelemetry.sdk")

from opentelemetry import context as otel_context  # noqa: E402
from opentelemetry import trace  # noqa: E402
from opentelemetry.context import Context  # noqa: E402
from opentelemetry.sdk.resources import Resource  # noqa: E402
from opentelemetry.sdk.trace import ReadableSpan, SpanLimits, SpanProcessor, TracerProvider  # noqa: E402
from opentelemetry.sdk.trace.export import SimpleSpanProcessor  # noqa: E402
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter  # noqa: E402
from opentelemetry.sdk.trace.id_generator import IdGenerator  # noqa: E402
from opentelemetry.sdk.trace.sampling import (  # noqa: E402
    ALWAYS_OFF,
    ALWAYS_ON,
    Decision,
    ParentBased,
    Sampler,
    SamplingResult,
    TraceIdRatioBased,
)

from streamer_core.telemetry import span_processors, span_recorder  # noqa: E402
from streamer_core.telemetry.span_recorder import Recorder, recorder_for  # noqa: E402
from tests.helpers import needs_shortcut  # noqa: E402

pytestmark = needs_shortcut("otel-spans", switch=False)


def provider_with(exporter: InMemorySpanExporter, **options: Any) -> TracerProvider:
    provider = TracerProvider(resource=Resource.create({"service.name": "recorder-test"}), **options)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider


def recorder_of(provider: TracerProvider) -> Recorder:
    made = recorder_for(provider, "9.9")
    assert made is not None
    return made


class ByName(Sampler):
    """Records every span but those named in ``drop``, adding an attribute
    of its own to those it records: a sampler that decides by name, as a
    user's may."""

    def __init__(self, drop: Sequence[str]) -> None:
        self.drop = set(drop)

    def should_sample(
        self,
        parent_context: Optional[Context],
        trace_id: int,
        name: str,
        kind: Any = None,
        attributes: Any = None,
        links: Any = None,
        trace_state: Any = None,
    ) -> SamplingResult:
        if name in self.drop:
            return SamplingResult(Decision.DROP)
        return SamplingResult(Decision.RECORD_AND_SAMPLE, {**(attributes or {}), "sampled.by": "name"})

    def get_description(self) -> str:
        return "ByName"


def test_a_request_with_its_steps_is_exported_as_the_sdk_exports_its_own_spans():
    exporter = InMemorySpanExporter()
    provider = provider_with(exporter)
    recorder = recorder_of(provider)
    request = recorder.start("POST /embed", None, {"http.route": "/embed"})
    with trace.use_span(request, end_on_exit=True):
        parse = recorder.child("parse", request.get_span_context())
        parse.end()
    [parsed, whole] = exporter.get_finished_spans()
    assert isinstance(whole, ReadableSpan) and isinstance(parsed, ReadableSpan)
    assert (whole.name, parsed.name) == ("POST /embed", "parse")
    assert whole.parent is None and parsed.parent == whole.get_span_context()
    assert parsed.context.trace_id == whole.context.trace_id != 0
    assert parsed.context.trace_flags.sampled and whole.context.trace_flags.sampled
    assert dict(whole.attributes or {}) == {"http.route": "/embed"}
    assert whole.resource.attributes["service.name"] == "recorder-test"
    assert whole.instrumentation_scope is not None
    assert (whole.instrumentation_scope.name, whole.instrumentation_scope.version) == ("streamer_core", "9.9")
    assert whole.start_time <= parsed.start_time <= parsed.end_time <= whole.end_time
    # What the SDK's tracer makes of the same under the same provider, field for field.
    sdk = provider.get_tracer("streamer_core", "9.9").start_span("POST /embed", attributes={"http.route": "/embed"})
    sdk.end()
    made = exporter.get_finished_spans()[-1]
    assert int(made.context.trace_flags) == int(
        whole.context.trace_flags
    )  # the random-id flag too, where the SDK sets it
    assert (made.kind, made.status.status_code, made.dropped_attributes) == (
        whole.kind, whole.status.status_code, whole.dropped_attributes
    )  # fmt: skip
    assert whole.to_json()  # what the console exporter writes


def test_the_providers_sampler_decides_and_a_sampler_that_decides_by_name_is_asked_for_every_span():
    exporter = InMemorySpanExporter()
    recorder = recorder_of(provider_with(exporter, sampler=ByName(["queue wait"])))
    assert not recorder.children_follow
    request = recorder.start("POST /embed", None, {"http.route": "/embed"})
    assert request.is_recording()
    dropped = recorder.child("queue wait", request.get_span_context())
    kept = recorder.child("in batch", request.get_span_context(), {"streamer.batch.size": 3})
    assert not dropped.is_recording()
    dropped.end()
    kept.end()
    request.end()
    names = {span.name: dict(span.attributes or {}) for span in exporter.get_finished_spans()}
    assert names == {
        "in batch": {"streamer.batch.size": 3, "sampled.by": "name"},
        "POST /embed": {"http.route": "/embed", "sampled.by": "name"},
    }


@pytest.mark.parametrize(
    "sampler, recorded",
    [(ALWAYS_OFF, False), (ParentBased(ALWAYS_OFF), False), (TraceIdRatioBased(0.0), False), (ALWAYS_ON, True)],
)
def test_a_root_span_is_recorded_as_the_sampler_says(sampler, recorded):
    exporter = InMemorySpanExporter()
    recorder = recorder_of(provider_with(exporter, sampler=sampler))
    span = recorder.start("batch m", Context(), {"streamer.model": "m"})
    assert span.is_recording() is recorded
    assert span.get_span_context().trace_flags.sampled is recorded
    assert span.get_span_context().is_valid  # its children follow its decision
    span.end()
    assert [s.name for s in exporter.get_finished_spans()] == (["batch m"] if recorded else [])


def test_a_span_under_an_unsampled_parent_follows_it_under_the_usual_sampler():
    exporter = InMemorySpanExporter()
    recorder = recorder_of(provider_with(exporter))  # ParentBased(ALWAYS_ON): the SDK's default
    assert recorder.by_parent and recorder.root_bound == 1 << 64 and recorder.children_follow
    unsampled = trace.NonRecordingSpan(trace.SpanContext(7, 8, is_remote=True, trace_flags=trace.TraceFlags(0)))
    span = recorder.start("POST /embed", trace.set_span_in_context(unsampled))
    assert not span.is_recording()
    assert span.get_span_context().trace_id == 7
    assert recorder.child("parse", span.get_span_context()).is_recording() is False
    span.end()
    assert exporter.get_finished_spans() == ()


def test_a_processor_that_acts_as_a_span_starts_is_called_with_the_live_span_even_if_added_later():
    exporter = InMemorySpanExporter()
    provider = provider_with(exporter)
    recorder = recorder_of(provider)
    recorder.start("before", Context()).end()

    class Tagging(SpanProcessor):
        def on_start(self, span: Any, parent_context: Any = None) -> None:
            span.set_attribute("tagged", True)

    straddling = recorder.start("straddling", Context())  # started before the processors came
    later = InMemorySpanExporter()
    provider.add_span_processor(Tagging())
    provider.add_span_processor(SimpleSpanProcessor(later))
    straddling.end()  # ended after: the new exporter gets it, as from the SDK's own span
    request = recorder.start("after", Context())
    recorder.child("step", request.get_span_context()).end()
    request.end()
    tagged = {span.name: (span.attributes or {}).get("tagged") for span in exporter.get_finished_spans()}
    assert tagged == {"before": None, "straddling": None, "step": True, "after": True}
    assert [span.name for span in later.get_finished_spans()] == ["straddling", "step", "after"]


def test_spans_reach_the_processors_of_a_provider_that_runs_them_concurrently():
    from opentelemetry.sdk.trace import ConcurrentMultiSpanProcessor

    class Where(SpanProcessor):
        """Notes the thread each span was handed over on."""

        def __init__(self) -> None:
            self.threads: List[Any] = []

        def on_end(self, span: Any) -> None:
            self.threads.append(threading.current_thread())

    exporter, where = InMemorySpanExporter(), Where()
    provider = TracerProvider(active_span_processor=ConcurrentMultiSpanProcessor(2), shutdown_on_exit=False)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    provider.add_span_processor(where)
    try:
        recorder = recorder_of(provider)
        request = recorder.start("POST /embed", Context())
        recorder.child("parse", request.get_span_context()).end()
        request.end()
        assert sorted(span.name for span in exporter.get_finished_spans()) == ["POST /embed", "parse"]
        # Handed over on the pool's threads, as the multi-processor runs its processors.
        assert len(where.threads) == 2 and threading.current_thread() not in where.threads
    finally:
        provider.shutdown()


def test_attributes_set_on_a_span_by_other_code_are_checked_and_limited_as_the_sdks_are(caplog):
    exporter = InMemorySpanExporter()
    provider = provider_with(exporter, span_limits=SpanLimits(max_span_attributes=3, max_links=2))
    recorder = recorder_of(provider)
    links = [trace.Link(trace.SpanContext(1, n, is_remote=False)) for n in range(1, 6)]
    ours = recorder.start("batch m", Context(), {"a": 1}, links)
    theirs = provider.get_tracer("t").start_span("batch m", context=Context(), attributes={"a": 1}, links=links)
    for span in (ours, theirs):
        span.set_attribute("user", "yes")
        span.set_attribute("not a value", object())  # dropped by the SDK's checks, with its warning
        span.set_attributes({"b": 2, "c": 3, "d": 4})  # over the limit of 3
        span.update_name("batch renamed")
        span.end()
    with caplog.at_level(logging.WARNING, logger="streamer_core"):
        ours.set_attribute("late", 1)
    assert "Setting an attribute on the ended span 'batch renamed'" in caplog.text
    mine, made = exporter.get_finished_spans()
    assert mine.name == made.name == "batch renamed"
    assert dict(mine.attributes or {}) == dict(made.attributes or {}) == {"b": 2, "c": 3, "d": 4}
    assert mine.dropped_attributes == made.dropped_attributes > 0
    assert [link.context.span_id for link in mine.links] == [link.context.span_id for link in made.links] == [4, 5]
    assert mine.dropped_links == made.dropped_links == 3


def test_an_exception_and_a_status_are_recorded_as_the_sdk_records_them():
    exporter = InMemorySpanExporter()
    provider = provider_with(exporter)
    recorder = recorder_of(provider)
    try:
        raise KeyError("missing")
    except KeyError as exc:
        error = exc
    ours = recorder.start("mine", Context())
    theirs = provider.get_tracer("t").start_span("theirs", context=Context())
    for span in (ours, theirs):
        span.record_exception(error, {"extra": 1})
        span.set_status(trace.StatusCode.ERROR, "went wrong")
        span.set_status(trace.StatusCode.UNSET)  # changes nothing
        span.end()
    mine, made = exporter.get_finished_spans()
    assert (mine.status.status_code, mine.status.description) == (made.status.status_code, made.status.description)
    [event] = mine.events
    [expected] = made.events
    assert event.name == expected.name == "exception"
    assert dict(event.attributes or {}) == dict(expected.attributes or {})
    exporter.clear()
    for span in (recorder.start("mine", Context()), provider.get_tracer("t").start_span("theirs", context=Context())):
        span.set_status(trace.StatusCode.OK)
        span.set_status(trace.StatusCode.ERROR, "too late: OK is final")
        span.end()
    assert [span.status.status_code for span in exporter.get_finished_spans()] == [trace.StatusCode.OK] * 2


def test_a_span_used_as_a_context_manager_records_the_error_leaving_it():
    exporter = InMemorySpanExporter()
    recorder = recorder_of(provider_with(exporter))
    with pytest.raises(ValueError):
        with recorder.start("failing", Context()):
            raise ValueError("bad input")
    [span] = exporter.get_finished_spans()
    assert span.status.status_code is trace.StatusCode.ERROR
    assert span.status.description == "ValueError: bad input"
    assert [event.name for event in span.events] == ["exception"]
    assert (span.events[0].attributes or {})["exception.escaped"] == "True"


def test_a_provider_other_than_the_sdks_gets_no_recorder():
    assert recorder_for(trace.NoOpTracerProvider(), None) is None
    assert recorder_for(trace.ProxyTracerProvider(), None) is None


def test_an_sdk_whose_spans_do_not_read_back_gets_no_recorder(monkeypatch):
    """A later SDK that keeps a span's fields elsewhere: the check made
    once a process finds it, and the streamer uses the tracer instead."""
    monkeypatch.setattr(span_recorder, "_checked", {})
    monkeypatch.setattr(ReadableSpan, "name", property(lambda self: self.__dict__.get("_span_name")))
    assert recorder_for(provider_with(InMemorySpanExporter()), None) is None
    monkeypatch.undo()
    assert recorder_for(provider_with(InMemorySpanExporter()), None) is not None


def test_an_api_that_keeps_the_current_span_elsewhere_gets_no_recorder(monkeypatch):
    """The recorder puts a request's span in the context under the key the
    API's ``set_span_in_context`` used when it was loaded; an API that
    reads the current span from elsewhere is found by the same check."""
    monkeypatch.setattr(span_recorder, "_checked", {})
    monkeypatch.setattr(span_recorder, "SPAN_KEY", "current-span-of-another-api")
    assert recorder_for(provider_with(InMemorySpanExporter()), None) is None


def test_a_method_with_an_empty_body_is_known_to_do_nothing():
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    def acts(span: Any, parent_context: Any = None) -> None:
        span.set_attribute("a", 1)

    def returns_early(span: Any, parent_context: Any = None) -> Optional[List[Any]]:
        return []

    assert span_processors.does_nothing(BatchSpanProcessor.on_start)
    assert span_processors.does_nothing(SimpleSpanProcessor.on_start)
    assert span_processors.does_nothing(SpanProcessor.on_start)  # its docstring only
    assert not span_processors.does_nothing(acts)
    assert not span_processors.does_nothing(returns_early)
    assert not span_processors.does_nothing(len)  # not Python: called


def test_a_ratio_sampler_decides_each_root_by_its_trace_id_and_children_follow():
    """Under ``ParentBased(TraceIdRatioBased(r))`` (the usual production
    set-up) a request with no parent is decided by the ratio sampler, on its
    trace id; the spans under a recorded one are recorded without asking."""
    half = 1 << 63  # TraceIdRatioBased(0.5) records a trace id whose low 64 bits are below this
    ids = [1, half + 1, (1 << 64) + 5, (1 << 64) - 1]
    exporter = InMemorySpanExporter()
    sampler = ParentBased(TraceIdRatioBased(0.5))
    recorder = recorder_of(provider_with(exporter, sampler=sampler, id_generator=Given(ids)))
    assert recorder.root_bound == half and recorder.children_follow
    recorded = []
    for _ in ids:
        request = recorder.start("POST /embed", None, {"http.route": "/embed"})
        recorded.append(request.is_recording())
        if request.is_recording():
            recorder.child("parse", request.get_span_context()).end()
        request.end()
    assert recorded == [True, False, True, False]
    spans = exporter.get_finished_spans()
    assert sorted(span.context.trace_id for span in spans if span.name == "POST /embed") == [1, (1 << 64) + 5]
    assert sorted(span.context.trace_id for span in spans if span.name == "parse") == [1, (1 << 64) + 5]


class Given(IdGenerator):
    """Trace ids from a list, and span ids counting up: two providers given
    the same list make the same trace ids, in turn."""

    def __init__(self, trace_ids: List[int]) -> None:
        self.trace_ids = iter(trace_ids)
        self.span_ids = iter(range(1, 100_000))

    def generate_trace_id(self) -> int:
        return next(self.trace_ids)

    def generate_span_id(self) -> int:
        return next(self.span_ids)


class RecordOnly(Sampler):
    """Records every span for the processors that look at all of them, and
    samples none (nothing is exported)."""

    def should_sample(self, parent_context: Any, trace_id: int, name: str, *args: Any, **kwargs: Any) -> SamplingResult:
        return SamplingResult(Decision.RECORD_ONLY)

    def get_description(self) -> str:
        return "RecordOnly"


class HighBits(TraceIdRatioBased):
    """A ratio sampler that describes itself as the SDK's but decides by the
    trace id's high 64 bits (as a later SDK might decide otherwise)."""

    def should_sample(self, parent_context: Any, trace_id: int, *args: Any, **kwargs: Any) -> SamplingResult:
        return super().should_sample(parent_context, trace_id >> 64, *args, **kwargs)


SAMPLERS = {
    "always on": lambda: ALWAYS_ON,
    "always off": lambda: ALWAYS_OFF,
    "parent-based, on": lambda: ParentBased(ALWAYS_ON),
    "parent-based, off": lambda: ParentBased(ALWAYS_OFF),
    "parent-based, a ratio": lambda: ParentBased(TraceIdRatioBased(0.3)),
    "a ratio": lambda: TraceIdRatioBased(0.3),
    "parent-based, a ratio of its own": lambda: ParentBased(HighBits(0.3)),
    "parent-based, one delegate changed": lambda: ParentBased(ALWAYS_ON, remote_parent_not_sampled=ALWAYS_ON),
    "by name": lambda: ByName(["POST /other"]),
    "record only": lambda: RecordOnly(),
}
PARENTS = {
    "none": None,
    "sampled, local": trace.SpanContext(77, 1, is_remote=False, trace_flags=trace.TraceFlags(1)),
    "not sampled, local": trace.SpanContext(78, 2, is_remote=False, trace_flags=trace.TraceFlags(0)),
    "sampled, remote": trace.SpanContext(79, 3, is_remote=True, trace_flags=trace.TraceFlags(1)),
    "not sampled, remote": trace.SpanContext(80, 4, is_remote=True, trace_flags=trace.TraceFlags(0)),
}


@pytest.mark.parametrize("how", ["start", "start_current"])
@pytest.mark.parametrize("parent", list(PARENTS))
@pytest.mark.parametrize("sampler", list(SAMPLERS))
def test_every_sampler_decides_as_it_does_for_the_sdks_tracer(sampler: str, parent: str, how: str) -> None:
    """Whether a request span is recorded and sampled, and with what trace
    state, for the SDK's samplers (those whose decision the recorder knows
    without asking, and others) under each kind of parent: as the SDK's
    tracer decides under the same provider, trace id for trace id, whether
    the parent is given (``start``) or current (``start_current``, which
    decides a root left out by its own shorter way). An id generator that
    gives an invalid id (0) makes an invalid span, as the SDK's tracer does."""
    import random

    picked = random.Random(7)
    bound = TraceIdRatioBased.get_bound_for_rate(0.3)
    ids = [picked.getrandbits(128) for _ in range(56)] + [
        bound - 1,
        bound,
        5 << 64 | bound,
        bound + 1,
        1,
        (1 << 64) - 1,
        0,
        7 << 64,
    ]
    state = trace.TraceState([("vendor", "x")])
    given = PARENTS[parent]
    context = None
    if given is not None:
        given = trace.SpanContext(given.trace_id, given.span_id, given.is_remote, given.trace_flags, state)
        context = trace.set_span_in_context(trace.NonRecordingSpan(given))
    ours = recorder_of(provider_with(InMemorySpanExporter(), sampler=SAMPLERS[sampler](), id_generator=Given(ids)))
    theirs = provider_with(InMemorySpanExporter(), sampler=SAMPLERS[sampler](), id_generator=Given(ids))
    tracer = theirs.get_tracer("streamer_core")
    for name in ["POST /embed", "POST /other"] * (len(ids) // 2):
        if how == "start":
            mine = ours.start(name, context, {"http.route": "/embed"})
        else:
            token = None if context is None else otel_context.attach(context)
            try:
                mine, holding = ours.start_current(name, {"http.route": "/embed"})
            finally:
                if token is not None:
                    otel_context.detach(token)
            assert trace.get_current_span(holding) is mine
        made = tracer.start_span(name, context=context, attributes={"http.route": "/embed"})
        a, b = mine.get_span_context(), made.get_span_context()
        assert (mine.is_recording(), a.trace_id, int(a.trace_flags), a.trace_state, a.is_valid) == (
            made.is_recording(), b.trace_id, int(b.trace_flags), b.trace_state, b.is_valid
        ), (sampler, parent, name, hex(a.trace_id))  # fmt: skip
        mine.end()
        made.end()


def test_a_root_left_out_by_the_ratio_is_decided_on_the_one_trace_id_it_keeps():
    """``start_current`` decides a root by a trace id it draws once: the
    spans recorded are those whose trace id is under the ratio's bound, and
    about the ratio's share of them (one drawn for the decision and another
    kept would record a quarter at one half). A request left out still
    carries a valid, unsampled context for what is made under it."""
    exporter = InMemorySpanExporter()
    recorder = recorder_of(provider_with(exporter, sampler=ParentBased(TraceIdRatioBased(0.5))))
    bound = recorder.root_bound
    assert bound == 1 << 63
    recorded = 0
    for _ in range(4000):
        span, holding = recorder.start_current("POST /embed", {"http.route": "/embed"})
        context = span.get_span_context()
        assert context.is_valid and trace.get_current_span(holding) is span
        assert span.is_recording() == (context.trace_id & ((1 << 64) - 1) < bound) == bool(context.trace_flags & 1)
        recorded += span.is_recording()
        span.end()
    # 4000 draws at one half: the mean 2000, its standard deviation about 32.
    assert 1840 < recorded < 2160
    assert len(exporter.get_finished_spans()) == recorded


def test_the_context_a_current_span_is_put_in_keeps_what_the_current_one_holds():
    """What ``start_current`` hands back to attach is the current context
    with the span in it: baggage and other values current stay."""
    from opentelemetry import baggage

    recorder = recorder_of(provider_with(InMemorySpanExporter(), sampler=ParentBased(TraceIdRatioBased(0.0))))
    token = otel_context.attach(baggage.set_baggage("tenant", "a"))
    try:
        span, holding = recorder.start_current("POST /embed")
    finally:
        otel_context.detach(token)
    assert not span.is_recording()
    assert baggage.get_baggage("tenant", holding) == "a"
    assert trace.get_current_span(holding) is span


# -- the SDK's batch processor, handed each span without a system call -----------------


def batched(exporter: Any, **options: Any) -> Any:
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    return BatchSpanProcessor(exporter, **{"schedule_delay_millis": 60_000, **options})


def a_request(recorder: Recorder) -> None:
    request = recorder.start("POST /embed", None, {"http.route": "/embed"})
    if request.is_recording():
        recorder.child("parse", request.get_span_context()).end()
    request.end()


def test_spans_reach_a_batch_processors_exporter_without_a_system_call_each(monkeypatch):
    """The SDK's ``BatchSpanProcessor`` asks ``os.getpid()`` of every span
    it is handed; the recorder puts its spans on the processor's queue
    without that call, and the exporter gets them all the same."""
    import os

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(batched(exporter))
    recorder = recorder_of(provider)
    a_request(recorder)  # the processors looked at once
    asked = []
    real = os.getpid
    monkeypatch.setattr(os, "getpid", lambda: asked.append(1) or real())
    for _ in range(100):
        a_request(recorder)
    monkeypatch.undo()
    assert len(asked) < 5, f"os.getpid() asked {len(asked)} times for 200 spans"
    assert provider.force_flush(10_000)
    names = [span.name for span in exporter.get_finished_spans()]
    assert names.count("POST /embed") == 101 and names.count("parse") == 101


def test_a_full_batch_wakes_the_batch_processors_worker():
    """As ``emit`` does: a queue holding a whole export batch is exported
    at once, not at the processor's next scheduled export."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(batched(exporter, max_export_batch_size=4))
    recorder = recorder_of(provider)
    for n in range(8):
        recorder.start(f"span {n}", None).end()
    deadline = time.monotonic() + 10
    while len(exporter.get_finished_spans()) < 8 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert len(exporter.get_finished_spans()) == 8  # the schedule's next export is a minute away


def test_a_batch_processor_gets_sampled_spans_only_as_its_on_end_takes_them():
    exporter = InMemorySpanExporter()
    provider = TracerProvider(sampler=RecordOnly())
    provider.add_span_processor(batched(exporter))
    recorder = recorder_of(provider)
    span = recorder.start("POST /embed", None)
    assert span.is_recording()  # recorded, for a processor that looks at every span...
    span.end()
    assert provider.force_flush(10_000)
    assert exporter.get_finished_spans() == ()  # ...and not sampled: not exported


def test_a_full_queue_drops_as_the_batch_processor_drops_and_says_so(caplog):
    """A span for a full queue goes to the processor's own ``emit``, which
    warns and drops the oldest, as it does for the SDK tracer's spans."""
    release = threading.Event()

    class Stuck(InMemorySpanExporter):
        def export(self, spans: Sequence[Any]) -> Any:
            release.wait(10)
            return super().export(spans)

    exporter = Stuck()
    provider = TracerProvider()
    provider.add_span_processor(batched(exporter, max_queue_size=8, max_export_batch_size=4))
    recorder = recorder_of(provider)
    with caplog.at_level(logging.WARNING):
        for n in range(40):
            recorder.start(f"span {n}", None).end()
    release.set()
    assert provider.force_flush(10_000)
    assert any("Queue full" in record.getMessage() for record in caplog.records)
    exported = [span.name for span in exporter.get_finished_spans()]
    assert "span 39" in exported and len(exported) <= 8 + 4  # the newest kept; at most a queue and a batch


def test_after_shutdown_spans_are_dropped_as_the_batch_processor_drops_them(caplog):
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(batched(exporter))
    recorder = recorder_of(provider)
    a_request(recorder)
    provider.shutdown()
    with caplog.at_level(logging.INFO):
        recorder.start("late", None).end()
    assert [span.name for span in exporter.get_finished_spans()] == ["parse", "POST /embed"]
    assert any("Shutdown called" in record.getMessage() for record in caplog.records)


def test_a_batch_processor_of_its_own_class_keeps_its_on_end():
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    ended: List[str] = []

    class Counting(BatchSpanProcessor):
        def on_end(self, span: ReadableSpan) -> None:
            ended.append(span.name)
            super().on_end(span)

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(Counting(exporter, schedule_delay_millis=60_000))
    a_request(recorder_of(provider))
    assert ended == ["parse", "POST /embed"]
    assert provider.force_flush(10_000) and len(exporter.get_finished_spans()) == 2


def test_a_forked_child_exports_through_its_own_batch_processor(tmp_path):
    """After a fork the child's spans reach the exporter through the
    child's batch processor (its worker started again there), as they do
    from the SDK's tracer."""
    import os

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(batched(exporter))
    recorder = recorder_of(provider)
    a_request(recorder)
    assert provider.force_flush(10_000)
    exporter.clear()
    pid = os.fork()
    if pid == 0:  # the child: report by exit status, never return into pytest
        code = 1
        try:
            for _ in range(3):
                a_request(recorder)
            flushed = provider.force_flush(10_000)
            code = 0 if flushed and len(exporter.get_finished_spans()) == 6 else 2
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert exporter.get_finished_spans() == ()  # the parent's exporter got none of the child's


def test_a_batch_processor_kept_otherwise_is_handed_spans_by_its_on_end(monkeypatch):
    """A later SDK whose batch processor keeps its queue elsewhere: its
    ``on_end`` is called, and the spans are exported all the same."""
    processor = batched(InMemorySpanExporter())
    assert isinstance(span_processors.ender(processor), span_processors.BatchQueue)
    assert not span_processors.BatchQueue.fits(object())
    monkeypatch.setattr(processor._batch_processor, "_queue", list(processor._batch_processor._queue))
    assert span_processors.ender(processor) == processor.on_end
    monkeypatch.undo()
    exporter = InMemorySpanExporter()
    processor = batched(exporter)
    monkeypatch.setattr(span_processors.BatchQueue, "fits", staticmethod(lambda batch: False))
    provider = TracerProvider()
    provider.add_span_processor(processor)
    a_request(recorder_of(provider))
    assert provider.force_flush(10_000) and len(exporter.get_finished_spans()) == 2


def test_a_root_left_out_keeps_the_random_trace_id_flag_of_a_random_generator():
    """W3C Trace Context level 2: a trace id drawn at random says so in its
    flags, sampled or not; the SDK's default generator draws at random."""
    random_bit = getattr(trace.TraceFlags, "RANDOM_TRACE_ID", 0)
    if not random_bit:
        pytest.skip("this OpenTelemetry API has no random-trace-id flag")
    recorder = recorder_of(provider_with(InMemorySpanExporter(), sampler=ParentBased(TraceIdRatioBased(0.0))))
    assert recorder.random_ids
    span, _ = recorder.start_current("POST /embed")
    flags = span.get_span_context().trace_flags
    assert not span.is_recording() and flags == random_bit, hex(flags)


class ZeroSpanIds(IdGenerator):
    """Valid trace ids, and span id 0 (invalid), as a broken generator of an application's gives."""

    def generate_trace_id(self) -> int:
        return 12345

    def generate_span_id(self) -> int:
        return 0


@pytest.mark.parametrize("sampler", ["left out", "recorded"])
def test_a_span_id_of_0_makes_an_invalid_span_as_the_sdks_tracer_does(sampler):
    chosen = ParentBased(TraceIdRatioBased(0.0)) if sampler == "left out" else ALWAYS_ON
    provider = provider_with(InMemorySpanExporter(), sampler=chosen, id_generator=ZeroSpanIds())
    recorder = recorder_of(provider)
    span, _ = recorder.start_current("POST /embed")
    made = provider.get_tracer("t").start_span("POST /embed")
    assert not span.get_span_context().is_valid and not made.get_span_context().is_valid
    assert not recorder.start("POST /embed", None).get_span_context().is_valid
