"""Tracing through Redis: the web side sends each call's span context with
its inputs (field ``tp``), and the worker's batch span links to it, with
the call's ``queue wait`` and ``in batch`` spans its children, across the
broker. (The worker runs in a thread of the test process here, so its
spans reach the same in-memory exporter.)"""

from __future__ import annotations

import threading

import pytest

pytest.importorskip("opentelemetry.sdk")

from opentelemetry import trace  # noqa: E402

from tests.redis import models  # noqa: E402
from tests.spans import finished, in_memory, named  # noqa: E402


def test_the_workers_batch_span_links_each_calls_span_sent_through_redis(broker, make_streamer, start_worker):
    exporter = in_memory()
    worker = start_worker(broker, models.double, batch_size=8, max_latency=0.2, tracing=True, item_cost=len)
    streamer = make_streamer(broker, tracing=True)
    assert streamer.wait_ready(10)
    tracer = trace.get_tracer("test")
    parents = {}
    results = {}

    def call(x: int) -> None:
        with tracer.start_as_current_span(f"request {x}") as span:
            parents[x] = span.get_span_context()
            results[x] = streamer.predict(["a" * (x + 1), "b"])

    callers = [threading.Thread(target=call, args=(x,)) for x in range(3)]
    for caller in callers:
        caller.start()
    for caller in callers:
        caller.join(20)
    assert results == {x: ["a" * (x + 1) * 2, "bb"] for x in range(3)}

    spans = finished(exporter)
    batches = [span for span in spans if span.name == f"batch {broker.prefix}"]
    assert {link for batch in batches for link in batch.links} == {p.span_id for p in parents.values()}
    for batch in batches:
        assert batch.parent is None
        assert batch.attributes["streamer.backend"] == "redis"
        assert batch.attributes["streamer.worker"] == worker.worker.consumer
        assert batch.attributes["streamer.device"] == "cpu"
        assert batch.attributes["streamer.batch.size"] == 2 * len(batch.links)
        assert batch.attributes["streamer.batch.cost"] > 0
    for parent in parents.values():
        [waited] = [span for span in named(spans, "queue wait") if span.parent == parent.span_id]
        [ran] = [span for span in named(spans, "in batch") if span.parent == parent.span_id]
        assert waited.trace_id == ran.trace_id == parent.trace_id
        [batch] = [batch for batch in batches if parent.span_id in batch.links]
        assert ran.links == [batch.span_id]
        assert waited.start <= waited.end == ran.start


def test_a_worker_that_does_not_trace_ignores_the_context_sent(broker, make_streamer, start_worker):
    exporter = in_memory()
    start_worker(broker, models.double, batch_size=8)
    streamer = make_streamer(broker, tracing=True)
    assert streamer.wait_ready(10)
    with trace.get_tracer("test").start_as_current_span("request"):
        assert streamer.predict([1, 2]) == [2, 4]
    assert [span.name for span in finished(exporter)] == ["request"]


def test_a_call_left_out_of_the_sample_crosses_redis_and_its_batch_makes_no_span(broker, make_streamer, start_worker):
    """The web side sends the context of a call the sampler left out too
    (flags 00): the worker makes no span for a batch of such calls alone."""
    exporter = in_memory()
    start_worker(broker, models.double, batch_size=8, tracing=True)
    streamer = make_streamer(broker, tracing=True)
    assert streamer.wait_ready(10)
    unsampled = trace.SpanContext(0x1234, 0x5678, is_remote=False, trace_flags=trace.TraceFlags(0))
    with trace.use_span(trace.NonRecordingSpan(unsampled)):
        assert streamer.predict([1, 2]) == [2, 4]
    assert finished(exporter) == []
    with trace.get_tracer("test").start_as_current_span("request") as span:
        assert streamer.predict([3]) == [6]
    [batch] = named(finished(exporter), f"batch {broker.prefix}")
    assert batch.links == [span.get_span_context().span_id]
