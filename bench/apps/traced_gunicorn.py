"""gunicorn's settings for ``bench.scale_bench``'s ``ours-thread-traced``:
the Flask example's own (``example_flask/gunicorn.conf.py``), and each
worker process given OpenTelemetry's SDK as a deployment sets it up (a
``BatchSpanProcessor``; an exporter that drops, as ``bench.tracing_bench``
has it) before it loads its models, recording the share of traces in
``BENCH_TRACE_SAMPLE`` (default 1: every one). The app traces by
``FLASK_STREAMER_TRACING=true``, which the benchmark sets."""

import os
import runpy

_example = runpy.run_path(os.path.join(os.path.dirname(__file__), "..", "..", "example_flask", "gunicorn.conf.py"))
globals().update({name: value for name, value in _example.items() if not name.startswith("__")})


def post_fork(server, worker):  # noqa: ANN001 - gunicorn's hook
    from bench.tracing_bench import sdk_provider

    sdk_provider(float(os.environ.get("BENCH_TRACE_SAMPLE", "1")))
