"""``STREAMER["TRACING"]``: a request to a batched view is served in a span
named by its route, with children for parsing, its queue wait, its run in
a batch (linked to the batch's span) and responding, in sync and async
views alike."""

from __future__ import annotations

import asyncio
import json

import pytest

pytest.importorskip("opentelemetry.sdk")

from django.test import AsyncClient  # noqa: E402

from tests.spans import finished, in_memory, named  # noqa: E402


def check_request(spans, name):
    [request] = named(spans, name)
    assert request.attributes["streamer.model"] == "double"
    children = sorted(span.name for span in spans if span.parent == request.span_id)
    assert children == ["in batch", "parse", "queue wait", "respond"]
    [batch] = [span for span in named(spans, "batch double") if request.span_id in span.links]
    [ran] = [span for span in named(spans, "in batch") if span.parent == request.span_id]
    assert ran.links == [batch.span_id]
    return request


def test_a_traced_views_request_span_names_its_route(client, streamer_settings):
    streamer_settings(TRACING=True)
    exporter = in_memory()
    response = client.post("/wrapped/21")
    assert response.status_code == 200 and response.json() == {"doubled": 42}
    request = check_request(finished(exporter), "POST /wrapped/<int:x>")
    assert request.attributes["http.route"] == "/wrapped/<int:x>"


def test_an_async_view_is_traced_alike(streamer_settings):
    streamer_settings(TRACING=True)
    exporter = in_memory()
    response = asyncio.run(AsyncClient().post("/adouble", json.dumps({"x": 2}), content_type="application/json"))
    assert response.json() == 4
    check_request(finished(exporter), "POST /adouble")


def test_an_async_views_async_respond_hook_runs_inside_its_respond_span(streamer_settings):
    """An async respond hook is awaited within the ``respond`` span: the
    span it makes is a child of it, and ``respond`` lasts until it is done."""
    streamer_settings(TRACING=True)
    exporter = in_memory()
    response = asyncio.run(
        AsyncClient().post("/arespond-traced", json.dumps({"x": 2}), content_type="application/json")
    )
    assert response.json() == {"doubled": 4}
    spans = finished(exporter)
    [encode] = named(spans, "encode")
    [respond] = named(spans, "respond")
    assert encode.parent == respond.span_id
    assert respond.start <= encode.start and encode.end <= respond.end


def test_a_model_traces_alone_when_its_entry_says_so(client, settings, streamer_settings):
    models = dict(settings.STREAMER["MODELS"])
    models["double"] = dict(models["double"], TRACING=True)
    streamer_settings(models)
    exporter = in_memory()
    assert client.post("/sizes-cbv", json.dumps({"x": "ab"}), content_type="application/json").status_code == 200
    assert finished(exporter) == []
    assert client.post("/double", json.dumps({"x": 1}), content_type="application/json").json() == 2
    check_request(finished(exporter), "POST /double")
