"""``bench.tracing_profile``'s reading of py-spy's samples: which are a
thread waiting, which are tracing's, and that the model's work under a
batch's span is not counted as tracing's."""

from __future__ import annotations

from bench.tracing_profile import classify, shares

SITE = "/srv/.venv/lib/python3.11/site-packages"
SERVE = f"WSGIHandler.handle ({SITE}/gevent/pywsgi.py:578);Cycle.serve (/srv/streamer_core/web/cycle.py:108)"
BATCH = "_ThreadBackend._loop (/srv/streamer_core/backends/thread.py:111)"
REQUEST = "request_span (/srv/streamer_core/telemetry/tracing.py:399)"


def test_a_sample_is_idle_tracing_or_other_by_its_frames() -> None:
    assert classify(f"Hub.run ({SITE}/gevent/hub.py:647)") == "idle"
    assert (
        classify(
            f"{BATCH};next_batch (/srv/streamer_core/batching/scheduler.py:366);Condition.wait (/py/threading.py:331)"
        )
        == "idle"
    )
    assert classify(f"{BATCH};acquire_with_timeout ({SITE}/gevent/_threading.py:36)") == "idle"
    assert classify(f"{SERVE};Hub.run (/srv/mine/hub.py:1)") == "other"  # a function of that name elsewhere
    assert classify(f"{SERVE};{REQUEST}") == "tracing"
    assert (
        classify(f"{SERVE};{REQUEST};Recorder.start_current (/srv/streamer_core/telemetry/span_recorder.py:330)")
        == "tracing"
    )
    assert classify(f"{SERVE};{REQUEST};get_current ({SITE}/opentelemetry/context/__init__.py:103)") == "tracing"
    assert classify(f"BatchProcessor.worker ({SITE}/opentelemetry/sdk/_shared_internal/__init__.py:120)") == "tracing"
    # OpenTelemetry's API called by other code (an instrumentation's span made current) is tracing's too.
    assert classify(f"{SERVE};use_span ({SITE}/opentelemetry/trace/__init__.py:580)") == "tracing"
    assert classify(f"{SERVE};Cycle._serve (/srv/streamer_core/web/cycle.py:146)") == "other"
    # The model's work, run inside the batch's span, is the model's.
    run = (
        "traced_run (/srv/streamer_core/telemetry/tracing.py:300);<lambda> (/srv/streamer_core/backends/thread.py:130)"
    )
    model = (
        f"{BATCH};{run};run_batch (/srv/streamer_core/batching/scheduler.py:80);"
        "encode (/srv/example_models/embedding.py:338)"
    )
    assert classify(model) == "other"
    # Tracing's own work after the batch has run is tracing's.
    after = (
        f"{BATCH};traced_run (/srv/streamer_core/telemetry/tracing.py:325);"
        "_request_spans (/srv/streamer_core/telemetry/tracing.py:340)"
    )
    assert classify(after) == "tracing"


def test_samples_are_counted_by_kind_and_tracings_by_where_they_entered_it() -> None:
    raw = "\n".join(
        [
            f"Hub.run ({SITE}/gevent/hub.py:647) 50",
            f"{SERVE};Cycle._serve (/srv/streamer_core/web/cycle.py:146) 40",
            f"{SERVE};{REQUEST} 7",
            f"{SERVE};capture (/srv/streamer_core/telemetry/tracing.py:205) 3",
            "",
        ]
    )
    kinds, where = shares(raw)
    assert kinds == {"idle": 50, "other": 40, "tracing": 10}
    assert where == {"request_span": 7, "capture": 3}
