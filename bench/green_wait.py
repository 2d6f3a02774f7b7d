"""How a greenlet waits for its batch under gevent's ``monkey.patch_all()``.

    .venv/bin/python -m bench.green_wait                  # about 40 s

gunicorn's gevent workers patch everything, so a view's wait on a lock
yields to the hub already. This measures what that wait costs beside the
one ``streamer_core.green`` gives every greenlet, patched or not: a waiter
on the hub's shared watcher, which a batch's results wake with one signal.

``--greenlets`` greenlets (128, as many as the HTTP benchmarks' connections)
call a thread-backend streamer back to back, each waiting as the web layers
do (``wait_call`` with a client socket that never closes). The model is a
simulated device: ``--fixed-ms`` plus ``--per-item-ms`` a batch, slept
through libc on the model's own OS thread (the GIL released, gevent never
yielded to). Two ways, interleaved, ``--repeat`` rounds of ``--seconds``:

* ``watcher``: the library as it is;
* ``lock``: the future's greenlet test turned off, so that each wait is a
  ``acquire(timeout)`` of a gevent lock that the model's thread releases.

Printed: calls per second and the process's CPU time (every thread) per
call, the median of the rounds, and the ratios watcher / lock.
"""

from __future__ import annotations

from gevent import monkey

monkey.patch_all()

import argparse  # noqa: E402  (after patching, as under gunicorn's gevent workers)
import statistics  # noqa: E402
import time  # noqa: E402
from typing import Dict, List, Optional, Sequence  # noqa: E402

import gevent  # noqa: E402

import streamer_core.future  # noqa: E402
from bench.sim import make_predict  # noqa: E402
from streamer_core import ThreadedStreamer  # noqa: E402
from streamer_core.web.peer import wait_call  # noqa: E402


class OpenSocket:
    """A client socket that never closes: ``peer_closed`` finds no descriptor."""

    def fileno(self) -> int:
        return -1


def measure(streamer: ThreadedStreamer, greenlets: int, seconds: float) -> Dict[str, float]:
    """Calls per second and CPU microseconds per call of ``greenlets``
    callers for ``seconds``."""
    sock, calls = OpenSocket(), [0]
    end = time.monotonic() + seconds

    def caller() -> None:
        while time.monotonic() < end:
            wait_call(streamer.submit([1]), sock)
            calls[0] += 1

    cpu, wall = time.process_time(), time.perf_counter()
    gevent.joinall([gevent.spawn(caller) for _ in range(greenlets)])
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    return {"calls_s": calls[0] / wall, "cpu_us": 1e6 * cpu / max(calls[0], 1)}


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.green_wait", description=__doc__.split("\n\n")[0])
    parser.add_argument("--greenlets", type=int, default=128)
    parser.add_argument("--seconds", type=float, default=3.0, help="per round and way (default 3)")
    parser.add_argument("--repeat", type=int, default=5, help="rounds, the ways interleaved (default 5)")
    parser.add_argument("--fixed-ms", type=float, default=1.0, help="the device's time per batch (default 1)")
    parser.add_argument("--per-item-ms", type=float, default=0.02, help="and per input (default 0.02)")
    args = parser.parse_args(argv)

    streamer = ThreadedStreamer(make_predict(args.fixed_ms, args.per_item_ms), batch_size=64, max_latency=0.01)
    greenlet_test = streamer_core.future.in_greenlet
    ways = {"watcher": greenlet_test, "lock": lambda: False}
    runs: Dict[str, List[Dict[str, float]]] = {way: [] for way in ways}
    try:
        measure(streamer, args.greenlets, 1.0)  # warm-up
        for _ in range(args.repeat):
            for way, test in ways.items():
                streamer_core.future.in_greenlet = test  # type: ignore[assignment]
                runs[way].append(measure(streamer, args.greenlets, args.seconds))
    finally:
        streamer_core.future.in_greenlet = greenlet_test  # type: ignore[assignment]
        streamer.close()

    median = {
        way: {key: statistics.median(run[key] for run in got) for key in ("calls_s", "cpu_us")}
        for way, got in runs.items()
    }
    print(
        f"{args.greenlets} greenlets, monkey.patch_all(), device {args.fixed_ms} ms"
        f" + {args.per_item_ms} ms an input, median of {args.repeat} rounds\n"
    )
    print("| wait | calls/s | CPU µs/call |\n| --- | --: | --: |")
    for way, got in median.items():
        print(f"| {way} | {got['calls_s']:,.0f} | {got['cpu_us']:.1f} |")
    watcher, lock = median["watcher"], median["lock"]
    calls, cpu = watcher["calls_s"] / lock["calls_s"], watcher["cpu_us"] / lock["cpu_us"]
    print(f"\nwatcher / lock: {calls:.2f}x the calls/s, {cpu:.2f}x the CPU a call")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
