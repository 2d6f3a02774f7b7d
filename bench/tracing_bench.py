"""What tracing costs a request: CPU per request through a Flask batched
route with ``STREAMER_TRACING`` off and on.

    .venv/bin/pip install -e '.[flask,otel]'
    .venv/bin/python -m bench.tracing_bench                # about half a minute
    .venv/bin/python -m bench.tracing_bench --sample 0.01  # one trace in a hundred recorded
    .venv/bin/python -m bench.tracing_bench --provider none  # no SDK: the API's no-op tracer

As ``bench/web_profile.py`` does, the WSGI app is called in this process,
one request after another (no server, no network), against a model that
costs nothing (as ``--stub-forward`` makes the example's): what is left is
the layer's own work, which is what tracing adds to. One request at a time
is the costliest case for tracing: every batch holds one request, so each
recorded request pays for a batch span of its own as well as its five spans
(the request, parse, queue wait, in batch and respond).

Tracing on goes through OpenTelemetry's SDK, as a deployment's does: a
``TracerProvider`` whose ``BatchSpanProcessor`` hands the spans to an
exporter that drops them (the cost of sending them on is the exporter's,
and happens on the processor's thread, counted here too). The engine alone
(``streamer.predict([s])``, no web framework, under a span of the caller's
own) is timed the same way. Each path is timed by this process's CPU time
(every thread's) over ``--requests`` requests, ``--repeat`` rounds, the
paths interleaved in each; the medians are shown, and what tracing adds is
the median of each round's difference (on minus off, timed one after the
other), with the middle half of those differences beside it: on a shared
machine the spread says how far to trust it. ``--provider none`` sets up no
SDK: tracing is on, and the API hands out its no-op tracer, as in a process
where nobody set a provider. ``--paths`` times some of the paths only
(``route-on``, say), as an instruction count under valgrind wants (see
bench/README.md).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from typing import Any, Callable, Dict, List, Optional, Sequence

from bench.web_profile import SENTENCE, call, cpu_per_request, environ, zero_model

#: The paths timed: a Flask batched route and a bare ``predict()``, tracing off and on.
PATHS = ("route-off", "route-on", "engine-off", "engine-on")


def sdk_provider(sample: float = 1.0) -> Any:
    """Set up the SDK as a deployment does, exporting to nowhere, recording
    the ``sample`` share of traces (a ratio sampler that follows the
    parent's decision, the SDK's usual one); return the provider."""
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
    from opentelemetry.sdk.trace.sampling import ALWAYS_ON, ParentBased, TraceIdRatioBased

    class Dropped(SpanExporter):
        def export(self, spans: Sequence[Any]) -> SpanExportResult:
            return SpanExportResult.SUCCESS

    provider = TracerProvider(sampler=ALWAYS_ON if sample >= 1.0 else ParentBased(TraceIdRatioBased(sample)))
    provider.add_span_processor(BatchSpanProcessor(Dropped()))
    trace.set_tracer_provider(provider)
    return provider


def measure(args: Any) -> Dict[str, List[float]]:
    from flask import Flask
    from opentelemetry import trace

    from flask_streamer import FlaskStreamer
    from streamer_core import ThreadedStreamer

    provider = sdk_provider(args.sample) if args.provider == "sdk" else None
    app = Flask("tracing_bench")
    app.config["STREAMER_MAX_LATENCY"] = 0.0
    streamer = FlaskStreamer(app)
    streamer.add_batched_route("/off", "off", zero_model(False), field="s")
    streamer.add_batched_route("/on", "on", zero_model(False), field="s", tracing=True)
    core_off = ThreadedStreamer(zero_model(False), 64, 0.0)
    core_on = ThreadedStreamer(zero_model(False), 64, 0.0, tracing=True)
    tracer = trace.get_tracer("tracing_bench")

    def traced_caller(streamer: Any) -> Callable[[], Any]:
        def run() -> Any:
            with tracer.start_as_current_span("caller"):
                return streamer.predict([SENTENCE])[0]

        return run

    every: Dict[str, Callable[[], Any]] = {
        "route-off": lambda base=environ("/off"): call(app, base),  # noqa: B008 - built once, on purpose
        "route-on": lambda base=environ("/on"): call(app, base),  # noqa: B008
        "engine-off": traced_caller(core_off),
        "engine-on": traced_caller(core_on),
    }
    paths = {name: every[name] for name in args.paths}
    try:
        for run_one in paths.values():  # warm up
            for _ in range(300):
                run_one()
        timings: Dict[str, List[float]] = {name: [] for name in paths}
        for _ in range(args.repeat):
            for name, run_one in paths.items():
                timings[name].append(cpu_per_request(run_one, args.requests))
                if provider is not None:
                    provider.force_flush()  # the exporter's work of these requests, counted with them
        return timings
    finally:
        streamer.close(app)
        core_off.close()
        core_on.close()
        if provider is not None:
            provider.shutdown()


def report(timings: Dict[str, List[float]], args: Any) -> str:
    """The table: each path's median, and what tracing adds, the median of
    each round's difference, with the middle half of those differences."""
    lines = [
        f"CPU µs per request, median of {args.repeat} interleaved timings of {args.requests} requests, "
        f"provider: {args.provider}, sampled: {args.sample:g} (the caller's span included on the engine's rows)",
        "",
        "| path | tracing off | tracing on | added | added, middle half of rounds | added, % of off |",
        "|---|--:|--:|--:|--:|--:|",
    ]
    for path in ("route", "engine"):
        if f"{path}-off" not in timings or f"{path}-on" not in timings:
            continue
        offs, ons = timings[f"{path}-off"], timings[f"{path}-on"]
        off, on = statistics.median(offs), statistics.median(ons)
        added = [b - a for a, b in zip(offs, ons)]
        low, middle, high = statistics.quantiles(added, n=4, method="inclusive") if len(added) > 1 else added * 3
        lines.append(
            f"| {path} | {off:.0f} | {on:.0f} | {middle:.1f} | {low:.1f} to {high:.1f} | {100 * middle / off:.1f}% |"
        )
    return "\n".join(lines)


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=2000, help="requests per timing (default 2000)")
    parser.add_argument("--repeat", type=int, default=7, help="interleaved timings per path (default 7)")
    parser.add_argument(
        "--provider",
        choices=["sdk", "none"],
        default="sdk",
        help="sdk: the SDK, a BatchSpanProcessor, an exporter that drops (default); none: the API's no-op",
    )
    parser.add_argument(
        "--sample",
        type=float,
        default=1.0,
        help="the share of traces the SDK records (default 1: all; 0.01: one in a hundred, parent-based)",
    )
    parser.add_argument(
        "--paths",
        type=lambda value: [name.strip() for name in value.split(",")],
        default=list(PATHS),
        help=f"the paths to time, comma-separated (default all: {','.join(PATHS)})",
    )
    parser.add_argument("--json", action="store_true", help="print every timing as JSON too")
    args = parser.parse_args(argv)
    unknown = set(args.paths) - set(PATHS)
    if unknown:
        parser.error(f"unknown path(s) {', '.join(sorted(unknown))}: choose among {', '.join(PATHS)}")
    timings = measure(args)
    print(report(timings, args))
    if args.json:
        print(json.dumps(timings))
    return 0


if __name__ == "__main__":
    sys.exit(main())
