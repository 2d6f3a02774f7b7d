"""What a request costs under gevent without monkey-patching, no network.

    .venv/bin/python -m bench.green_profile                 # /noop and /stream, about 30 s

128 greenlets on one unpatched hub (as under gevent's ``WSGIServer`` run as
it is) call the WSGI application of ``bench.apps.http_app`` directly, each
request after the last, for ``--seconds`` per timing, ``--repeat`` times,
interleaved by endpoint. The model is the simulated device of
``bench/sim.py`` (``--fixed-ms`` + ``--per-item-ms`` per batch, on its own
OS thread, the GIL released), fast enough that the hub is the limit, as in
``bench/http_bench.py --fixed-ms 2 --per-item-ms 0.05``. It shows what the
HTTP benchmark's ratio ``/stream`` / ``/noop`` is made of without the
server's own parsing and sockets:

* ``cpu us/req``: the process's CPU time (every thread) per request;
* ``gc us/req``: of that, the time in the cyclic garbage collector (from
  ``gc.callbacks``). A request that waits holds its framework objects (the
  request context, headers, the response) while other greenlets allocate,
  so each young-generation collection finds the ones in flight and keeps
  them: with many requests waiting at once, collections cost several times
  what they cost a view that finishes before the next request starts.
"""

from __future__ import annotations

import argparse
import gc
import io
import json
import os
import statistics
import time
from typing import Any, Dict, List, Optional

GREENLETS = 128


class GcClock:
    """Seconds spent in the garbage collector, from its callbacks."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self._started = 0.0

    def __call__(self, phase: str, info: Dict[str, Any]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
        else:
            self.seconds += time.perf_counter() - self._started


def measure(app: Any, path: str, seconds: float, clock: GcClock) -> Dict[str, float]:
    """Requests per second, CPU and GC microseconds per request, for 128
    greenlets calling ``path`` back to back for ``seconds``."""
    import gevent
    from werkzeug.test import EnvironBuilder

    from bench.apps.http_app import SENTENCE

    body = json.dumps({"s": SENTENCE}).encode()
    base = EnvironBuilder(path=path, method="POST", data=body, content_type="application/json").get_environ()
    done = [0]

    def start_response(status: str, headers: Any, exc_info: Any = None) -> None:
        if not status.startswith("200"):
            raise RuntimeError(f"{path} answered {status}")

    def caller(stop: float) -> None:
        while time.monotonic() < stop:
            environ = dict(base, **{"wsgi.input": io.BytesIO(body)})
            response = app(environ, start_response)
            b"".join(response)
            response.close()
            done[0] += 1

    gc_before, cpu_before, started = clock.seconds, time.process_time(), time.monotonic()
    gevent.joinall([gevent.spawn(caller, started + seconds) for _ in range(GREENLETS)])
    elapsed, n = time.monotonic() - started, max(1, done[0])
    return {
        "rps": n / elapsed,
        "cpu_us": (time.process_time() - cpu_before) / n * 1e6,
        "gc_us": (clock.seconds - gc_before) / n * 1e6,
    }


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--endpoints", default="noop,stream", help="comma-separated routes of bench.apps.http_app")
    parser.add_argument("--seconds", type=float, default=3.0, help="length of one timing (default 3)")
    parser.add_argument("--repeat", type=int, default=3, help="timings of each endpoint, interleaved (default 3)")
    parser.add_argument("--fixed-ms", type=float, default=2.0, help="simulated device: ms per batch (default 2)")
    parser.add_argument("--per-item-ms", type=float, default=0.05, help="simulated device: ms per item (default 0.05)")
    args = parser.parse_args(argv)
    os.environ["BENCH_HTTP_FIXED_MS"] = str(args.fixed_ms)
    os.environ["BENCH_HTTP_PER_ITEM_MS"] = str(args.per_item_ms)
    os.environ["BENCH_HTTP_SERVER"] = "green_profile"
    import gevent  # imported, never monkey-patched

    from bench.apps.http_app import create_app

    app = create_app()
    clock = GcClock()
    gc.callbacks.append(clock)
    endpoints = ["/" + name.strip().lstrip("/") for name in args.endpoints.split(",") if name.strip()]
    runs: Dict[str, List[Dict[str, float]]] = {path: [] for path in endpoints}

    def run_all() -> None:
        for path in endpoints:  # warm-up
            measure(app, path, 0.5, clock)
        for _ in range(args.repeat):
            for path in endpoints:
                runs[path].append(measure(app, path, args.seconds, clock))

    gevent.spawn(run_all).join()
    print(
        f"{GREENLETS} greenlets, unpatched gevent, sim {args.fixed_ms:g} ms + {args.per_item_ms:g} ms/item; "
        f"medians of {args.repeat} timings of {args.seconds:g} s\n"
    )
    print("| endpoint | requests/s | cpu us/req | gc us/req |")
    print("|---|--:|--:|--:|")
    for path, results in runs.items():
        row = {key: statistics.median(r[key] for r in results) for key in ("rps", "cpu_us", "gc_us")}
        print(f"| {path} | {row['rps']:.0f} | {row['cpu_us']:.1f} | {row['gc_us']:.1f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
