"""Tracing (``tracing=True``): each batch's span, linked to the spans its
calls were made in, and each call's ``queue wait`` and ``in batch`` spans,
as children of its own, on the thread and process backends; off, nothing
of OpenTelemetry is imported. (Redis: tests/redis/test_tracing.py; the web
layers' request spans: tests/flask and tests/django.)"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("opentelemetry.sdk")

from opentelemetry import trace  # noqa: E402

from streamer_core import Streamer, ThreadedStreamer  # noqa: E402
from streamer_core.telemetry.tracing import from_traceparent  # noqa: E402
from tests.core.models import TracedDouble, double  # noqa: E402
from tests.helpers import needs_shortcut  # noqa: E402
from tests.spans import finished, in_memory, named, read_file  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


def test_a_batch_span_links_each_call_and_each_call_gets_its_own_spans(closing):
    exporter = in_memory()
    gate = threading.Event()

    def model(batch):
        gate.wait(10)
        return [x * 2 for x in batch]

    streamer = closing(ThreadedStreamer(model, batch_size=8, max_latency=0.5, tracing=True, name="doubler"))
    tracer = trace.get_tracer("test")
    parents = {}
    futures = []
    for x in range(3):
        with tracer.start_as_current_span(f"request {x}") as span:
            parents[x] = span.get_span_context().span_id
            futures.append(streamer.submit([x, x + 10]))
    gate.set()
    assert [f.result(10) for f in futures] == [[0, 20], [2, 22], [4, 24]]

    spans = finished(exporter)
    batches = named(spans, "batch doubler")
    assert batches, spans
    linked = {link for batch in batches for link in batch.links}
    assert linked == set(parents.values())  # one link per call, whatever its inputs
    batch = max(batches, key=lambda span: span.attributes["streamer.batch.size"])
    assert batch.parent is None  # a batch belongs to no one request: fan-in is by links
    assert batch.attributes["streamer.model"] == "doubler"
    assert batch.attributes["streamer.backend"] == "thread"
    assert batch.attributes["streamer.worker"] == "thread"
    assert batch.attributes["streamer.device"] == "cpu"
    assert batch.attributes["streamer.batch.size"] == 2 * len(batch.links)
    assert batch.attributes["streamer.batch.cost"] == 2 * len(batch.links)  # max: length x costliest (1)
    assert batch.attributes["streamer.batch.model_seconds"] >= 0

    for x, parent in parents.items():
        waits = [span for span in named(spans, "queue wait") if span.parent == parent]
        runs = [span for span in named(spans, "in batch") if span.parent == parent]
        assert len(waits) == len(runs) == 1, (x, spans)
        ran_in = next(b for b in batches if parent in b.links)
        assert runs[0].links == [ran_in.span_id]  # the call's view of its batch, linked to it
        assert runs[0].attributes["streamer.request.inputs"] == 2
        assert waits[0].end == runs[0].start == ran_in.start
        assert waits[0].start <= waits[0].end


UNSAMPLED = trace.SpanContext(0x1234, 0x5678, is_remote=False, trace_flags=trace.TraceFlags(0))


def test_a_call_left_out_of_the_sample_costs_its_batch_no_link_and_no_spans(closing):
    """A call made in a span the sampler did not record (its trace is kept
    nowhere) gets no spans of its own, and a batch of such calls alone
    makes no span at all: nobody will look for it."""
    exporter = in_memory()
    streamer = closing(ThreadedStreamer(double, batch_size=8, max_latency=0.01, tracing=True, name="unsampled"))
    with trace.use_span(trace.NonRecordingSpan(UNSAMPLED)):
        assert streamer.predict([3]) == [6]
    assert finished(exporter) == []


def _one_batch(streamer, calls):
    """Submit each of ``calls`` (a span to submit it in, or ``None``: no span
    current) into one batch of ``len(calls)`` inputs; their results."""
    futures = []
    for x, span in enumerate(calls):
        if span is None:
            futures.append(streamer.submit([x]))
        else:
            with trace.use_span(span):
                futures.append(streamer.submit([x]))
    return [future.result(10) for future in futures]


def test_a_batch_links_its_sampled_calls_only_and_has_a_span_while_one_call_is_sampled_or_untraced(closing):
    """A batch span is made unless every input of the batch was left out of
    the sample: one sampled call (linked, with its own spans) or one call
    made with no span current (a root the sampler decides on) is enough;
    the unsampled calls beside them get no link and no spans."""
    exporter = in_memory()
    streamer = closing(ThreadedStreamer(double, batch_size=3, max_latency=5, tracing=True, name="mixed"))
    unsampled = trace.NonRecordingSpan(UNSAMPLED)
    with trace.get_tracer("test").start_as_current_span("sampled") as sampled:
        parent = sampled.get_span_context().span_id
    assert _one_batch(streamer, [sampled, unsampled, unsampled]) == [[0], [2], [4]]
    spans = finished(exporter)
    [batch] = named(spans, "batch mixed")
    assert batch.links == [parent] and batch.attributes["streamer.batch.size"] == 3
    assert [span.parent for span in named(spans, "queue wait")] == [parent]
    assert [span.parent for span in named(spans, "in batch")] == [parent]

    exporter.clear()
    assert _one_batch(streamer, [unsampled, None, unsampled]) == [[0], [2], [4]]
    spans = finished(exporter)
    [batch] = named(spans, "batch mixed")
    assert batch.links == [] and batch.attributes["streamer.batch.size"] == 3
    assert [span.name for span in spans] == ["batch mixed"]


GOOD_TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


def test_a_traceparent_that_crossed_is_read_as_w3c_says_and_anything_else_is_refused():
    """What a worker reads from a batch message or a Redis entry: a valid
    traceparent (str or bytes, sampled or not, a later version with more
    after it) as its context, remote; anything else as no trace at all."""
    call = from_traceparent(GOOD_TRACEPARENT, 7)
    assert call is not None and call.sampled and call.arrived_ns == 7
    assert (call.context.trace_id, call.context.span_id) == (0x0AF7651916CD43DD8448EB211C80319C, 0xB7AD6B7169203331)
    assert call.context.is_remote
    assert from_traceparent(GOOD_TRACEPARENT.encode(), 7) == call
    left_out = from_traceparent(GOOD_TRACEPARENT[:-2] + "00", 7)
    assert left_out is not None and not left_out.sampled
    later = from_traceparent("01" + GOOD_TRACEPARENT[2:] + "-what-comes-next", 7)
    assert later is not None and later.context.span_id == call.context.span_id
    zeros = "0" * 32
    for bad in ["", "garbage", GOOD_TRACEPARENT.upper(), GOOD_TRACEPARENT[:-1], GOOD_TRACEPARENT + "-more",
                "ff" + GOOD_TRACEPARENT[2:], f"00-{zeros}-b7ad6b7169203331-01",
                "00-0af7651916cd43dd8448eb211c80319c-0000000000000000-01", b"\xff\xfe", 42, None]:  # fmt: skip
        assert from_traceparent(bad, 7) is None, bad


@settings(max_examples=300, deadline=None)
@given(
    st.sampled_from(["00", "00", "01", "ff", "0g"]),
    st.one_of(st.just(0), st.integers(1, 2**128 - 1)),
    st.one_of(st.just(0), st.integers(1, 2**64 - 1)),
    st.integers(0, 255),
    st.sampled_from(["", "", "-", "-later", "x"]),
    st.sampled_from(["as it is", "as it is", "upper case", "cut short"]),
)
def test_reading_a_traceparent_agrees_with_opentelemetrys_propagator(version, trace_id, span_id, flags, tail, mangle):
    """The quick reading of the usual version gives what the propagator
    gives, for values near a valid one and not quite."""
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    value = f"{version}-{trace_id:032x}-{span_id:016x}-{flags:02x}{tail}"
    value = {"as it is": value, "upper case": value.upper(), "cut short": value[:-1]}[mangle]
    context = trace.get_current_span(TraceContextTextMapPropagator().extract({"traceparent": value}))
    expected = context.get_span_context()
    call = from_traceparent(value, 0)
    if not expected.is_valid:
        assert call is None, value
    else:
        assert call is not None, value
        assert (call.context.trace_id, call.context.span_id, call.context.trace_flags) == (
            expected.trace_id, expected.span_id, expected.trace_flags
        )  # fmt: skip


def test_request_span_names_are_made_once_per_endpoint_and_kept_for_a_bounded_number():
    """A request span's name and attributes are made once per endpoint and
    reused; a route given as a path (Django's fallback) makes as many as it
    has paths, so only the first ones are kept: memory stays bounded, and
    every span is still named by its own route."""
    from streamer_core.telemetry import tracing

    exporter = in_memory()
    for n in range(tracing._MOST_REQUEST_NAMES + 50):
        with tracing.request_span("POST", f"/path/{n}", "bounded"):
            pass
    assert len(tracing._request_names) <= tracing._MOST_REQUEST_NAMES
    last = tracing._MOST_REQUEST_NAMES + 49
    [span] = named(finished(exporter), f"POST /path/{last}")
    assert span.attributes["http.route"] == f"/path/{last}"
    with tracing.request_span("POST", "/path/0", "bounded"):
        pass
    assert tracing._request_names[("POST", "/path/0", "bounded")][0] == "POST /path/0"


class OwnSpan(trace.NonRecordingSpan):
    """A span class of an application's own (an API span, not one the
    recorder makes)."""


@needs_shortcut("otel-spans")
def test_a_call_captures_the_current_span_whichever_kind_it_is():
    """What a call carries to its batch is the context of the span current
    when it is submitted: the recorder's, the SDK tracer's, a non-recording
    one, a span class of the application's own; with none, nothing."""
    from opentelemetry import context as otel_context

    from streamer_core.telemetry import tracing

    in_memory()
    assert tracing.recorder() is not None
    assert tracing.capture() is None
    request = tracing.request_span("POST", "/embed", "captured")
    sdk_span = trace.get_tracer("test").start_span("the sdk's")
    # Left out, its trace id drawn at random (W3C's flag 0x02): not sampled.
    left_out = trace.SpanContext(11, 12, is_remote=True, trace_flags=trace.TraceFlags(0x02))
    own = trace.SpanContext(13, 14, is_remote=False, trace_flags=trace.TraceFlags(1))
    for span in [request.span, sdk_span, trace.NonRecordingSpan(left_out), OwnSpan(own)]:
        token = otel_context.attach(trace.set_span_in_context(span))
        try:
            call = tracing.capture()
        finally:
            otel_context.detach(token)
        assert call is not None and call.context == span.get_span_context(), span
        assert call.sampled == bool(span.get_span_context().trace_flags & 1)
    with request:
        call = tracing.capture()
    assert call is not None and call.context == request.span.get_span_context() and call.sampled
    assert tracing.capture() is None
    zero = trace.NonRecordingSpan(trace.SpanContext(15, 0, is_remote=False, trace_flags=trace.TraceFlags(1)))
    token = otel_context.attach(trace.set_span_in_context(zero))
    try:
        assert tracing.capture() is None  # span id 0: an invalid context carries nothing to the batch
    finally:
        otel_context.detach(token)
    invalid = otel_context.attach(trace.set_span_in_context(trace.INVALID_SPAN))
    try:
        assert tracing.capture() is None
    finally:
        otel_context.detach(invalid)


def test_the_batch_span_is_current_while_the_model_runs(closing):
    exporter = in_memory()
    tracer = trace.get_tracer("test")

    def model(batch):
        with tracer.start_as_current_span("inside the model"):
            return batch

    streamer = closing(ThreadedStreamer(model, batch_size=4, tracing=True, name="nested"))
    assert streamer.predict([1]) == [1]
    spans = finished(exporter)
    [inner] = named(spans, "inside the model")
    [batch] = named(spans, "batch nested")
    assert inner.parent == batch.span_id


def test_off_a_streamer_makes_no_span(closing):
    exporter = in_memory()
    streamer = closing(ThreadedStreamer(double, batch_size=4))
    with trace.get_tracer("test").start_as_current_span("caller"):
        assert streamer.predict([1, 2]) == [2, 4]
    assert [span.name for span in finished(exporter)] == ["caller"]


def test_off_nothing_of_opentelemetry_is_imported():
    code = (
        "import sys\n"
        "import streamer_core, flask_streamer\n"
        "from streamer_core import ThreadedStreamer\n"
        "s = ThreadedStreamer(lambda b: b, batch_size=4)\n"
        "assert s.predict([1]) == [1]\n"
        "s.close()\n"
        "print(sorted(m for m in sys.modules if m.startswith('opentelemetry')))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_without_opentelemetry_the_engine_runs_and_tracing_is_refused_with_how_to_install():
    code = (
        "import sys\n"
        "sys.modules['opentelemetry'] = None  # as if not installed\n"
        "from streamer_core import ThreadedStreamer\n"
        "s = ThreadedStreamer(lambda b: b, batch_size=4)\n"
        "assert s.predict([1]) == [1]\n"
        "s.close()\n"
        "try:\n"
        "    ThreadedStreamer(lambda b: b, batch_size=4, tracing=True)\n"
        "except ValueError as exc:\n"
        "    print(exc)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "tracing is True, but OpenTelemetry is not installed: pip install 'streamer-core[otel]'" in out.stdout


def test_tracing_is_a_flag():
    with pytest.raises(TypeError, match="tracing must be True or False, got 'yes'"):
        ThreadedStreamer(double, batch_size=4, tracing="yes")


def test_a_process_worker_makes_the_batch_span_linked_to_the_calls_context(closing, tmp_path):
    """The call's context crosses to the worker process, which makes the
    batch's span and the call's own; a call left out of the sample before
    it crosses too (its batch makes no span there)."""
    in_memory()
    path = tmp_path / "spans.jsonl"
    streamer = closing(
        Streamer(TracedDouble, batch_size=8, worker_num=1, model_init_kwargs={"path": str(path)}, tracing=True)
    )
    assert streamer.wait_ready(60)
    with trace.use_span(trace.NonRecordingSpan(UNSAMPLED)):
        assert streamer.predict([5]) == [10]
    tracer = trace.get_tracer("test")
    with tracer.start_as_current_span("request") as span:
        parent = span.get_span_context()
        assert streamer.predict([1, 2, 3]) == [2, 4, 6]

    spans = read_file(path)  # written by the worker before it answered
    [batch] = named(spans, "batch TracedDouble")
    assert batch.links == [parent.span_id]
    assert batch.parent is None
    assert batch.attributes["streamer.backend"] == "process"
    assert batch.attributes["streamer.worker"] == "worker 0"
    assert batch.attributes["streamer.device"] == "cpu"
    assert batch.attributes["streamer.batch.size"] == 3
    assert batch.attributes["streamer.batch.cost"] == 3.0
    [waited] = named(spans, "queue wait")
    [ran] = named(spans, "in batch")
    # Children, across the process boundary, of the span the call was made in.
    assert waited.parent == ran.parent == parent.span_id
    assert waited.trace_id == ran.trace_id == parent.trace_id
    assert ran.links == [batch.span_id]


def test_a_web_layers_redis_workers_trace_when_its_settings_say_so(closing):
    from streamer_core.web.spec import ModelSpec

    spec = ModelSpec.checked(
        "embed", double, {"backend": "redis", "redis_url": "redis://127.0.0.1:6379/0", "tracing": True}
    )
    assert spec.worker_group().options["tracing"] is True
    assert closing(spec.build()).config.tracing is True  # its web side sends each call's context


@pytest.mark.parametrize("switch", ["1", "0"])
def test_with_the_otel_spans_shortcut_off_spans_are_made_by_the_sdks_tracer(switch):
    """``STREAMER_SHORTCUTS=0`` (or an SDK outside the releases the span
    recorder is tested on): the streamer makes its spans with the
    provider's own tracer, and they are recorded all the same."""
    code = (
        "from opentelemetry import trace\n"
        "from opentelemetry.sdk.trace import TracerProvider\n"
        "from opentelemetry.sdk.trace.export import SimpleSpanProcessor\n"
        "from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter\n"
        "from streamer_core import ThreadedStreamer, shortcuts\nfrom streamer_core.telemetry import tracing\n"
        "memory = InMemorySpanExporter()\n"
        "provider = TracerProvider()\n"
        "provider.add_span_processor(SimpleSpanProcessor(memory))\n"
        "trace.set_tracer_provider(provider)\n"
        "s = ThreadedStreamer(lambda b: b, batch_size=4, tracing=True)\n"
        "with tracing.request_span('POST', '/echo', 'echo'):\n"
        "    assert s.predict([1]) == [1]\n"
        "s.close()\n"
        "print(tracing.recorder() is not None, sorted({span.name for span in memory.get_finished_spans()}))\n"
    )
    env = {**os.environ, "STREAMER_SHORTCUTS": switch}
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60, env=env)
    assert out.returncode == 0, out.stderr
    recorded, names = out.stdout.strip().split(" ", 1)
    from streamer_core import shortcuts

    assert recorded == str(switch == "1" and shortcuts.release_problem("otel-spans") is None)
    assert "POST /echo" in names and "batch" in names, names
