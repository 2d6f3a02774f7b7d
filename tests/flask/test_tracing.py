"""``STREAMER_TRACING``: a request to a batched route is served in a span
named by its route, with children for parsing, its queue wait, its run in
a batch (linked to the batch's span) and responding; an error's status is
on the span. (The engine's spans: tests/core/test_tracing.py.)"""

from __future__ import annotations

import pytest

pytest.importorskip("opentelemetry.sdk")

from opentelemetry import trace  # noqa: E402

from streamer_core.errors import ConfigurationError  # noqa: E402
from tests.flask.apps import double  # noqa: E402
from tests.spans import finished, in_memory, named  # noqa: E402


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
