"""The examples against service_streamer in a plain view, over HTTP, with the
real model: the deployment of issue #16, side by side, interleaved.

    apt-get install -y wrk
    .venv/bin/pip install -e '.[example,bench]'
    .venv/bin/python -m bench.web_bench --repeat 3          # about 15 minutes

Each variant runs under gunicorn, 1 process, ``-k gthread --threads 128``,
and wrk drives ``-t2 -c128`` POSTs of ``{"s": "<a 15-word sentence>"}`` at
``/stream``: 5 s of warm-up, then ``--duration`` seconds measured.

* ``flask-example``: ``example_flask`` as shipped (``@batched_route``, its
  settings, its ``gunicorn.conf.py``);
* ``flask-ss``: service_streamer 0.1.2's ``ThreadedStreamer`` in a plain
  Flask view (``bench/web_apps.py``), batch 64, the same model;
* ``django-example`` and ``django-ss``: the same on Django;
* ``flask-core``, ``django-core`` (with ``--variants``): streamer_core's
  ``ThreadedStreamer`` in the plain views, to tell the layer from the engine.

Shown: requests/s (median and range), the server's CPU per request (its
processes' user + system time over the run, from /proc), and each example
over its plain-view rival.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Dict, List, Optional, Tuple

from bench.http_app import SENTENCE
from bench.http_bench import _cpu_ticks, _free_port, run_wrk

ROOT = Path(__file__).resolve().parents[1]
VARIANTS: Dict[str, Tuple[List[str], Dict[str, str]]] = {
    "flask-example": (["-c", "example_flask/gunicorn.conf.py", "example_flask:create_app()"], {}),
    # The example with batches by count alone (no cost budget): a diagnostic.
    "flask-example-count": (
        ["-c", "example_flask/gunicorn.conf.py", "example_flask:create_app()"],
        {"FLASK_STREAMER_ITEM_COST": "null", "FLASK_STREAMER_MAX_BATCH_COST": "null"},
    ),
    "flask-ss": (["bench.web_apps:flask_app()"], {}),
    "flask-core": (["bench.web_apps:flask_app()"], {"BENCH_WEB_STREAMER": "core"}),
    "django-example": (["-c", "example_django/gunicorn.conf.py", "example_django.wsgi"], {}),
    "django-ss": (["bench.web_apps:django_application"], {}),
    "django-core": (["bench.web_apps:django_application"], {"BENCH_WEB_STREAMER": "core"}),
}
PAIRS = [("flask-example", "flask-ss"), ("django-example", "django-ss")]
BODY = json.dumps({"s": SENTENCE})


def _post(port: int, timeout: float) -> int:
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/stream", BODY.encode(), {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=timeout) as response:
        return int(response.status)


def run_variant(name: str, args: argparse.Namespace, log_dir: str) -> Dict[str, float]:
    options, extra_env = VARIANTS[name]
    port = _free_port()
    argv = [
        sys.executable, "-m", "gunicorn", *options[:-1], "-b", f"127.0.0.1:{port}", "-w", "1",
        "-k", "gthread", "--threads", "128", "--log-level", "warning", options[-1],
    ]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FLASK_", "STREAMER_", "WEB_", "BIND"))}
    env.update(extra_env, PYTHONPATH=str(ROOT), PYTHONUNBUFFERED="1")
    log = open(os.path.join(log_dir, f"{name}.log"), "ab")
    server = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=log, stderr=log, start_new_session=True)
    try:
        deadline = time.monotonic() + 180
        while True:
            try:
                if _post(port, 60) == 200:
                    break
            except OSError:
                pass
            if server.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{name} did not start; see {log.name}")
            time.sleep(0.5)
        url = f"http://127.0.0.1:{port}/stream"
        run_wrk(url, args.connections, args.warmup, 10, BODY)
        ticks_before = _cpu_ticks(server.pid)
        summary, _ = run_wrk(url, args.connections, args.duration, 10, BODY)
        ticks = _cpu_ticks(server.pid) - ticks_before
        errors = summary["connect"] + summary["read"] + summary["write"] + summary["status"] + summary["timeout"]
        seconds = summary["duration_us"] / 1e6
        requests = summary["requests"]
        return {
            "rps": requests / seconds,
            "cpu_ms_per_request": ticks / os.sysconf("SC_CLK_TCK") / max(1, requests) * 1000,
            "p50_ms": summary["lat_p50_us"] / 1000,
            "p99_ms": summary["lat_p99_us"] / 1000,
            "errors": errors,
        }
    finally:
        try:
            os.killpg(server.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        server.wait(30)
        log.close()


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--variants", default="flask-example,flask-ss,django-example,django-ss")
    parser.add_argument("--repeat", type=int, default=3, help="runs of each variant, interleaved (default 3)")
    parser.add_argument("--duration", type=float, default=10.0, help="measured seconds per run (default 10)")
    parser.add_argument("--warmup", type=float, default=5.0, help="unmeasured seconds of load first (default 5)")
    parser.add_argument("--connections", type=int, default=128)
    args = parser.parse_args(argv)
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown:
        parser.error(f"unknown variants {unknown}; known: {', '.join(VARIANTS)}")
    runs: Dict[str, List[Dict[str, float]]] = {v: [] for v in variants}
    with tempfile.TemporaryDirectory(prefix="web-bench-") as log_dir:
        for r in range(args.repeat):
            for name in variants:
                result = run_variant(name, args, log_dir)
                runs[name].append(result)
                print(
                    f"run {r + 1}/{args.repeat} {name:15} {result['rps']:7.1f} req/s "
                    f"{result['cpu_ms_per_request']:.2f} CPU ms/request, p99 {result['p99_ms']:.0f} ms, "
                    f"errors {result['errors']:.0f}",
                    file=sys.stderr,
                )
    medians = {name: statistics.median(r["rps"] for r in results) for name, results in runs.items()}
    print(f"\ngunicorn -w 1 -k gthread --threads 128, wrk -c{args.connections}, {args.duration:g} s runs, "
          f"median of {args.repeat} interleaved")  # fmt: skip
    print("| variant | req/s (median) | range | server CPU ms per request | p99 ms | errors |")
    print("|---|--:|--:|--:|--:|--:|")
    for name, results in runs.items():
        rates = [r["rps"] for r in results]
        cpu = statistics.median(r["cpu_ms_per_request"] for r in results)
        p99 = statistics.median(r["p99_ms"] for r in results)
        errors = sum(r["errors"] for r in results)
        spread = f"{min(rates):.0f}-{max(rates):.0f}"
        print(f"| {name} | {medians[name]:.0f} | {spread} | {cpu:.2f} | {p99:.0f} | {errors:.0f} |")
    for ours, theirs in PAIRS:
        if ours in medians and theirs in medians:
            print(f"\n{ours} / {theirs}: {medians[ours] / medians[theirs]:.2f}x (target >= 1.1x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
