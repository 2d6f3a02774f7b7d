"""``STREAMER_TRACING``: a request to a batched route is served in a span
named by its route, with children for parsing, its queue wait, its run in
a batch (linked to the batch's span) and responding; an error's status is
on the span. (The engine's spans: tests/core/test_tracing.py.)"""

from __future__ import annotations

import pytest

pytest.importorskip("opentelemetry.sdk")

from opentelemetry import trace  # noqa: E402

from streamer_core.errors import ConfigurationError  # noqa: E402
from streamer_core.telemetry import tracing  # noqa: E402
from tests.flask.apps import double, fail_on_boom  # noqa: E402
from tests.helpers import needs_shortcut  # noqa: E402
from tests.spans import finished, in_memory, named, shape  # noqa: E402


def test_a_request_span_names_the_route_and_holds_each_step(make_app):
    exporter = in_memory()
    app, streamer = make_app({"STREAMER_TRACING": True})
    streamer.add_batched_route("/double/<kind>", "double", double)
    response = app.test_client().post("/double/int", json=21)
    assert response.status_code == 200 and response.get_json() == 42

    spans = finished(exporter)
    [request] = named(spans, "POST /double/<kind>")
    assert request.attributes["http.route"] == "/double/<kind>"
    assert request.attributes["streamer.model"] == "double"
    children = sorted(span.name for span in spans if span.parent == request.span_id)
    assert children == ["in batch", "parse", "queue wait", "respond"]
    [batch] = named(spans, "batch double")
    assert batch.links == [request.span_id]
    [ran] = named(spans, "in batch")
    assert ran.links == [batch.span_id]


def test_a_request_left_out_of_the_sample_makes_no_span_at_all(make_app):
    """A request whose span the sampler drops (made here under a span that
    was not sampled, which the parent-based sampler follows) gets no
    parse, queue wait, in batch or respond span, and its batch none."""
    exporter = in_memory()
    app, streamer = make_app({"STREAMER_TRACING": True})
    streamer.add_batched_route("/double", "double", double)
    unsampled = trace.SpanContext(0x1234, 0x5678, is_remote=False, trace_flags=trace.TraceFlags(0))
    with trace.use_span(trace.NonRecordingSpan(unsampled)):
        response = app.test_client().post("/double", json=21)
    assert response.status_code == 200 and response.get_json() == 42
    assert finished(exporter) == []
    assert app.test_client().post("/double", json=1).get_json() == 2  # sampled: every span, as above
    assert sorted(span.name for span in finished(exporter)) == [
        "POST /double", "batch double", "in batch", "parse", "queue wait", "respond"
    ]  # fmt: skip


def test_a_failed_request_says_its_status_on_its_span(make_app):
    exporter = in_memory()
    app, streamer = make_app({"STREAMER_TRACING": True})
    streamer.add_batched_route("/double", "double", double)
    assert app.test_client().post("/double", data=b"{not json", content_type="application/json").status_code == 400
    [request] = named(finished(exporter), "POST /double")
    assert request.attributes["http.response.status_code"] == 400


def test_a_route_may_trace_alone_and_untraced_routes_make_no_span(make_app):
    exporter = in_memory()
    app, streamer = make_app()
    streamer.add_batched_route("/plain", "plain", double)
    streamer.add_batched_route("/traced", "traced", double, tracing=True)
    client = app.test_client()
    assert client.post("/plain", json=1).get_json() == 2
    assert [span.name for span in finished(exporter)] == []
    assert client.post("/traced", json=1).get_json() == 2
    assert named(finished(exporter), "POST /traced")


def test_tracing_must_be_a_flag(make_app):
    with pytest.raises(ConfigurationError, match="STREAMER_TRACING must be True or False, got 'on'"):
        make_app({"STREAMER_TRACING": "on"})


@needs_shortcut("otel-spans")
def test_the_spans_recorded_are_those_the_sdks_tracer_makes(make_app, monkeypatch):
    """The streamer makes its spans with a recorder of its own where the
    provider is the SDK's (streamer_core.telemetry.span_recorder): an answered
    request, one refused at parsing and one whose model failed export the
    same spans, ids and times aside, as when they are made with the SDK's
    tracer."""

    def serve() -> list:
        exporter = in_memory()
        app, streamer = make_app({"STREAMER_TRACING": True})
        streamer.add_batched_route("/words", "words", fail_on_boom)
        client = app.test_client()
        assert client.post("/words", json="fine").get_json() == "ok:fine"
        assert client.post("/words", data=b"{cut", content_type="application/json").status_code == 400
        assert client.post("/words", json="boom").status_code == 500
        return shape(finished(exporter))

    assert tracing.recorder() is not None
    recorded = serve()
    monkeypatch.setattr(tracing, "recorder", lambda: None)
    made_by_the_tracer = serve()
    assert recorded == made_by_the_tracer
    names = sorted(span[0] for span in recorded)
    assert names.count("POST /words") == 3 and names.count("batch words") == 2, names
    assert any(span[5] == "ERROR" and span[6] for span in recorded)  # the 500: failed, with its exception


@pytest.mark.parametrize("made_by", ["recorder", "tracer"])
def test_spans_made_in_a_routes_hooks_are_children_of_its_steps(make_app, monkeypatch, made_by):
    """A parse or respond hook's own spans (a client library's, say) are
    children of the step they ran in, whichever way the streamer makes its
    spans."""
    exporter = in_memory()
    if made_by == "tracer":
        monkeypatch.setattr(tracing, "recorder", lambda: None)
    tracer = trace.get_tracer("test")

    def parse(req):
        with tracer.start_as_current_span("decode"):
            return req.get_json()

    def respond(output):
        with tracer.start_as_current_span("encode"):
            return {"y": output}

    app, streamer = make_app({"STREAMER_TRACING": True})
    streamer.add_batched_route("/hooks", "hooks", double, parse=parse, respond=respond)
    assert app.test_client().post("/hooks", json=4).get_json() == {"y": 8}
    spans = finished(exporter)
    ids = {span.span_id: span for span in spans}
    [decode] = named(spans, "decode")
    [encode] = named(spans, "encode")
    assert ids[decode.parent].name == "parse" and ids[encode.parent].name == "respond"
    [request] = named(spans, "POST /hooks")
    assert ids[decode.parent].parent == ids[encode.parent].parent == request.span_id


SILENT = """
import asyncio
import logging
import sys
import threading
from flask import Flask
from opentelemetry import trace
from flask_streamer import FlaskStreamer
from streamer_core.telemetry import tracing
from streamer_core.web.cycle import Cycle

app = Flask(__name__)
app.config["STREAMER_TRACING"] = True
streamer = FlaskStreamer(app)
streamer.add_batched_route("/double", "double", lambda batch: [2 * value for value in batch])
client = app.test_client()
# The cycle as an async view serves it (Django's): the same model, awaited.
cycle = Cycle(lambda status, body, headers: (status, body), logging.getLogger("t"), "the view", lambda: False,
              lambda exc: None)
if sys.argv[1] == "noop":
    trace.set_tracer_provider(trace.NoOpTracerProvider())
made = []

def watch(frame, event, arg):
    if event == "call" and frame.f_code.co_name in ("start_span", "set_span_in_context", "start"):
        if "opentelemetry" in frame.f_code.co_filename or "span_recorder" in frame.f_code.co_filename:
            made.append(frame.f_code.co_name)

def served(value, awaited=False):
    sys.setprofile(watch)
    threading.setprofile(watch)
    try:
        if awaited:
            model = streamer.get_streamer("double", app)
            return asyncio.run(cycle.aserve("double", lambda: model, lambda: value, lambda out: out,
                                            traced=("POST", "/adouble")))
        return client.post("/double", json=value).get_json()
    finally:
        sys.setprofile(None)
        threading.setprofile(None)

assert served(21) == 42  # the model loads on this first request
made.clear()
assert served(4) == 8 and served(3, awaited=True) == 6 and tracing.silent()
print("silent", len(made))
if sys.argv[1] in ("later", "custom"):  # a provider set while the app serves is seen at once
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))

    class Custom(trace.TracerProvider):  # a provider not the SDK's: its own tracer makes the spans
        def get_tracer(self, *args, **kwargs):
            return provider.get_tracer(*args, **kwargs)

    trace.set_tracer_provider(provider if sys.argv[1] == "later" else Custom())
    assert served(5) == 10 and not tracing.silent()
    print("recorded", sorted(span.name for span in exporter.get_finished_spans()))
    exporter.clear()
    assert served(7, awaited=True) == 14
    print("awaited", sorted(span.name for span in exporter.get_finished_spans()))
"""


@pytest.mark.parametrize("provider", ["none", "noop", "later", "custom"])
def test_with_no_sdk_set_up_a_request_makes_no_span_and_a_provider_set_later_records(provider: str) -> None:
    """Tracing on where nothing records (no provider set, so the API's
    proxy; or the API's no-op provider): no span is started for a request
    or its batch, by the API or the recorder, in a sync view or an async
    one. A provider set later, while the app serves (the SDK's, or one of
    its own), records the next request's every span."""
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    out = subprocess.run(
        [sys.executable, "-c", SILENT, provider], cwd=root, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0] == "silent 0", out.stdout
    if provider in ("later", "custom"):
        assert lines[1] == "recorded ['POST /double', 'batch double', 'in batch', 'parse', 'queue wait', 'respond']"
        assert lines[2] == "awaited ['POST /adouble', 'batch double', 'in batch', 'parse', 'queue wait', 'respond']"
