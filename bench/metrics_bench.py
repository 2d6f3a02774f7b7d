"""What counting costs: the same load with this checkout and with a checkout
from before the metrics (``--baseline``, a git ref), side by side, interleaved.

    .venv/bin/python -m bench.metrics_bench --repeat 5

Each run is a fresh interpreter whose ``streamer_core`` comes from one tree:
``clients`` threads call ``ThreadedStreamer.predict([x])`` back to back for
``--duration`` seconds, and the calls per second are counted. Two loads:

* ``engine``: a model that returns its inputs at once, so the run measures
  the library's own CPU per call, nothing else: the worst case for any cost
  added per call;
* ``device``: the simulated accelerator of ``bench/sim.py`` (10 ms + 0.2 ms
  per input, batch 64), where the device bounds the throughput as in a
  deployment.

Variants: ``baseline`` (the ref, no counting), ``stats`` (this checkout:
plain-Python counting, and the Prometheus collector that reads it at scrape
time only), ``multiprocess`` (this checkout with ``PROMETHEUS_MULTIPROC_DIR``
set, as under gunicorn with several workers: every record also goes to
``prometheus_client``'s files). The table shows the median run of each and
its ratio to the baseline's median, and the process's CPU time per call
(steadier than the rate on a shared machine) against the baseline's.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Dict, List, Optional

ROOT = Path(__file__).resolve().parents[1]
#: The last commit before streamer_core counted anything.
DEFAULT_BASELINE = "0e4d027"

_CHILD = r"""
import json, sys, threading, time
tree, load, duration, clients = sys.argv[1], sys.argv[2], float(sys.argv[3]), int(sys.argv[4])
sys.path.insert(0, tree)
import streamer_core
assert streamer_core.__file__.startswith(tree), streamer_core.__file__
from streamer_core import ThreadedStreamer
from bench.sim import make_predict

if load == "engine":
    predict = lambda batch: batch
else:
    predict = make_predict(10.0, 0.2)
streamer = ThreadedStreamer(predict, 64, 0.1)
stop = threading.Event()
counts = [0] * clients
measuring = threading.Event()

def client(c):
    n = 0
    while not stop.is_set():
        assert streamer.predict([n])[0] == n
        if measuring.is_set():
            counts[c] += 1
        n += 1

threads = [threading.Thread(target=client, args=(c,), daemon=True) for c in range(clients)]
for t in threads:
    t.start()
time.sleep(1.0)  # warm up
measuring.set()
started, cpu_started = time.monotonic(), time.process_time()
time.sleep(duration)
measuring.clear()
elapsed, cpu = time.monotonic() - started, time.process_time() - cpu_started
stop.set()
for t in threads:
    t.join(10)
streamer.close()
print(json.dumps({"calls_per_s": sum(counts) / elapsed, "cpu_us_per_call": cpu / max(1, sum(counts)) * 1e6}))
"""


_RECORDING = r"""
import json, sys, timeit
from streamer_core.telemetry.stats import stats_for
stats = stats_for("metrics-bench-recording")
arrivals = [0.001 * i for i in range(64)]

def one_batch():
    stats.batch_ran(0.1, 0.02, arrivals)  # a model call of 64 inputs
    stats.succeeded(64)  # and its 64 calls answered

rounds = 20000
best = min(timeit.repeat(one_batch, number=rounds, repeat=5)) / rounds
print(json.dumps({"us_per_call": best / 64 * 1e6}))
"""


def _recording_cost(multiproc_dir: Optional[str]) -> float:
    """What recording one batch of 64 (its sizes, seconds and queue waits,
    and its 64 calls answered) costs per call, microseconds: the least of
    five timings of 20,000 batches, in one thread."""
    env = {k: v for k, v in os.environ.items() if k.lower() != "prometheus_multiproc_dir"}
    if multiproc_dir is not None:
        env["PROMETHEUS_MULTIPROC_DIR"] = multiproc_dir
    out = subprocess.run(
        [sys.executable, "-c", _RECORDING], env=env, cwd=ROOT, check=True, capture_output=True, text=True, timeout=300
    )
    return float(json.loads(out.stdout.strip().splitlines()[-1])["us_per_call"])


def _worktree(ref: str, folder: str) -> str:
    path = os.path.join(folder, "baseline")
    subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", path, ref], check=True, capture_output=True)
    return path


def _run(tree: str, load: str, duration: float, clients: int, multiproc_dir: Optional[str]) -> Dict[str, float]:
    env = {k: v for k, v in os.environ.items() if k.lower() != "prometheus_multiproc_dir"}
    if multiproc_dir is not None:
        env["PROMETHEUS_MULTIPROC_DIR"] = multiproc_dir
    out = subprocess.run(
        [sys.executable, "-c", _CHILD, tree, load, str(duration), str(clients)],
        env=env,
        cwd=tree,
        check=True,
        capture_output=True,
        text=True,
        timeout=duration + 60,
    )
    result: Dict[str, float] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--baseline", default=DEFAULT_BASELINE, help=f"git ref without metrics (default {DEFAULT_BASELINE})"
    )
    parser.add_argument("--repeat", type=int, default=3, help="runs of each variant, interleaved (default 3)")
    parser.add_argument("--duration", type=float, default=4.0, help="measured seconds per run (default 4)")
    parser.add_argument("--clients", type=int, default=64, help="client threads (default 64)")
    parser.add_argument("--loads", default="engine,device", help="comma-separated: engine, device")
    args = parser.parse_args(argv)
    loads = [name.strip() for name in args.loads.split(",") if name.strip()]
    results: Dict[str, Dict[str, List[Dict[str, float]]]] = {}
    with tempfile.TemporaryDirectory(prefix="metrics-bench-") as folder:
        baseline = _worktree(args.baseline, folder)
        try:
            for r in range(args.repeat):
                for load in loads:
                    for variant in ("baseline", "stats", "multiprocess"):
                        tree = baseline if variant == "baseline" else str(ROOT)
                        multiproc = None
                        if variant == "multiprocess":
                            multiproc = tempfile.mkdtemp(dir=folder)
                        run = _run(tree, load, args.duration, args.clients, multiproc)
                        results.setdefault(load, {}).setdefault(variant, []).append(run)
                        print(
                            f"run {r + 1}/{args.repeat} {load:6} {variant:12} {run['calls_per_s']:9.0f} calls/s "
                            f"{run['cpu_us_per_call']:7.1f} CPU us/call",
                            file=sys.stderr,
                        )
        finally:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", baseline], capture_output=True)
        recording = {
            "stats": _recording_cost(None),
            "multiprocess": _recording_cost(tempfile.mkdtemp(dir=folder)),
        }
    print("\nRecording alone, per call (batches of 64, one thread, best of 5 timings):")
    print("| variant | us per call |")
    print("|---|--:|")
    for variant, cost in recording.items():
        print(f"| {variant} | {cost:.2f} |")
    print(f"\n{args.clients} clients, {args.duration:g} s per run, median of {args.repeat} interleaved runs")
    print("| load | variant | calls/s (median) | range | of baseline | CPU us per call (median) | more than baseline |")
    print("|---|---|--:|--:|--:|--:|--:|")
    for load, variants in results.items():
        base = statistics.median(run["calls_per_s"] for run in variants["baseline"])
        base_cpu = statistics.median(run["cpu_us_per_call"] for run in variants["baseline"])
        for variant, runs in variants.items():
            rates = [run["calls_per_s"] for run in runs]
            median, cpu = statistics.median(rates), statistics.median(run["cpu_us_per_call"] for run in runs)
            print(
                f"| {load} | {variant} | {median:.0f} | {min(rates):.0f}-{max(rates):.0f} | {median / base:.3f} "
                f"| {cpu:.1f} | {cpu - base_cpu:+.1f} |"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
