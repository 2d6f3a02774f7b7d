"""Tracing (``tracing=True``): each batch's span, linked to the spans its
calls were made in, and each call's ``queue wait`` and ``in batch`` spans,
as children of its own, on the thread and process backends; off, nothing
of OpenTelemetry is imported. (Redis: tests/redis/test_tracing.py; the web
layers' request spans: tests/flask and tests/django.)"""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path

import pytest

pytest.importorskip("opentelemetry.sdk")

from opentelemetry import trace  # noqa: E402

from streamer_core import Streamer, ThreadedStreamer  # noqa: E402
from tests.core.models import TracedDouble, double  # noqa: E402
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


def test_a_call_left_out_of_the_sample_costs_its_batch_no_link_and_no_spans(closing):
    """A call made in a span the sampler did not record (its trace is kept
    nowhere): its batch links it not, and it gets no spans of its own."""
    exporter = in_memory()
    streamer = closing(ThreadedStreamer(double, batch_size=8, max_latency=0.01, tracing=True, name="unsampled"))
    unsampled = trace.SpanContext(0x1234, 0x5678, is_remote=False, trace_flags=trace.TraceFlags(0))
    with trace.use_span(trace.NonRecordingSpan(unsampled)):
        assert streamer.predict([3]) == [6]
    spans = finished(exporter)
    [batch] = named(spans, "batch unsampled")
    assert batch.links == [] and not named(spans, "queue wait") and not named(spans, "in batch"), spans


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
    in_memory()
    path = tmp_path / "spans.jsonl"
    streamer = closing(
        Streamer(TracedDouble, batch_size=8, worker_num=1, model_init_kwargs={"path": str(path)}, tracing=True)
    )
    assert streamer.wait_ready(60)
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
