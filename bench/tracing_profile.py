"""Where a traced request's CPU goes, served: the share of the web
process's busy CPU spent in tracing's code, sampled by py-spy under load.

    apt-get install -y wrk
    .venv/bin/pip install -e '.[example,otel,bench]'
    .venv/bin/python -m bench.tracing_profile --sample 0.01   # one trace in a hundred; about a minute a round
    .venv/bin/python -m bench.tracing_profile --sample 1 --rounds 3

``bench.scale_bench``'s ``ours-thread-traced`` deployment (the Flask
example under gunicorn, the thread backend, OpenTelemetry's SDK in the web
process recording ``--sample`` of the traces, an exporter that drops them),
the forward pass stubbed, wrk at ``--connections``. While wrk runs, py-spy
samples every thread of the web process (``--rate`` a second, the process
paused for each sample, so that each stack is whole). A sample is *busy*
unless its innermost frame is a thread waiting (the event loop in libev,
the model's thread waiting for a batch, a thread's timed wait); a busy
sample is *tracing's* when some frame of it is streamer_core's tracing code
(``streamer_core/telemetry/tracing.py``, ``streamer_core/telemetry/span_recorder.py``) or
OpenTelemetry's, and no frame under that one runs the batch (the model's
work, which the batch's span wraps, is not tracing's).

Why beside ``scale_bench``'s CPU time: tracing adds a few percent to a
request, and one run's CPU time per request moves more than that from run
to run on a shared machine (bench/README.md, "What tracing costs"). A
sample is one request's code or another's at the same instant, so the
share is measured within one run, with its own count of samples: with
``n`` of ``N`` busy samples tracing's, the share's standard error is about
``sqrt(n) / N``. The pause for each sample slows the server (its requests
a second are lower under py-spy); the share is of the CPU it did spend.
What sampling cannot see: what tracing's objects cost the rest later (a
garbage collection, the caches), which is what the CPU time catches.
"""

from __future__ import annotations

import argparse
import collections
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
from typing import Any, Counter, Dict, List, Optional, Sequence, Tuple

from bench import harness
from bench.scale_bench import Deployment
from bench.scale_bench import parse_args as scale_args

#: Where tracing's code lives, in a frame's file name (py-spy's ``--full-filenames``).
TRACING_FILES = ("streamer_core/telemetry/tracing.py", "streamer_core/telemetry/span_recorder.py", "/opentelemetry/")
#: A frame that runs the batch: what it calls is the model's work.
BATCH_FRAMES = ("run_batch (",)
#: A thread waiting, as the innermost frame of its stack (function, the end
#: of its file's name): not busy.
IDLE_FRAMES = (
    ("Hub.run", "/gevent/hub.py"),  # the event loop, in libev
    ("acquire_with_timeout", "/gevent/_threading.py"),  # the model's thread, waiting for a batch
    ("Condition.wait", "/threading.py"),  # a thread's timed wait (the span processor's)
    ("Thread._wait_for_tstate_lock", "/threading.py"),
)


def _idle(frame: str) -> bool:
    """Whether ``frame`` (``function (file:line)``) is one of :data:`IDLE_FRAMES`."""
    function, _, where = frame.partition(" (")
    file = where.rpartition(":")[0]
    return any(function == name and file.endswith(end) for name, end in IDLE_FRAMES)


def classify(stack: str) -> str:
    """``"idle"``, ``"tracing"`` or ``"other"``, for one sampled stack
    (py-spy's raw format: frames outermost first, ``;`` between them)."""
    frames = stack.split(";")
    if _idle(frames[-1]):
        return "idle"
    first = next((i for i, frame in enumerate(frames) if any(part in frame for part in TRACING_FILES)), None)
    if first is None:
        return "other"
    if any(frame.startswith(BATCH_FRAMES) for frame in frames[first + 1 :]):
        return "other"
    return "tracing"


def shares(raw: str) -> Tuple[Counter[str], Counter[str]]:
    """Samples by kind, and tracing's by its outermost tracing frame, from
    py-spy's raw output."""
    kinds: Counter[str] = collections.Counter()
    where: Counter[str] = collections.Counter()
    for line in raw.splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack:
            continue
        kind = classify(stack)
        kinds[kind] += int(count)
        if kind == "tracing":
            frame = next(f for f in stack.split(";") if any(part in f for part in TRACING_FILES))
            where[frame.split(" (")[0]] += int(count)
    return kinds, where


def web_worker(master_pid: int) -> int:
    """The one gunicorn worker under ``master_pid``."""
    with open(f"/proc/{master_pid}/task/{master_pid}/children") as handle:
        children = [int(pid) for pid in handle.read().split()]
    if len(children) != 1:
        raise RuntimeError(f"expected one web worker under gunicorn's master, found {children}")
    return children[0]


def one_round(args: argparse.Namespace, folder: str, py_spy: str) -> Dict[str, Any]:
    """Start the traced deployment, load it, sample it; its counts."""
    deployment = Deployment("ours-thread-traced", args, folder)
    try:
        deployment.start()
        deployment.wait_ready()
        url = f"http://127.0.0.1:{deployment.port}{deployment.route}"
        harness.run_wrk(url, args.connections[0], args.warmup, 30, deployment.body)
        assert deployment.web is not None
        worker = web_worker(deployment.web.pid)
        output = os.path.join(folder, "samples.txt")
        # py-spy samples for the middle of the measured run: it starts once wrk has.
        spy = subprocess.Popen(
            [py_spy, "record", "-p", str(worker), "-d", str(max(1, round(args.duration - 2))), "-r",
             str(args.rate), "-f", "raw", "--full-filenames", "-o", output],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        summary, _ = harness.run_wrk(url, args.connections[0], args.duration, 30, deployment.body)
        _, err = spy.communicate(timeout=60)
        if spy.returncode != 0 or not os.path.exists(output):
            raise RuntimeError(f"py-spy failed ({spy.returncode}): {err.strip()[-500:]}")
        with open(output) as handle:
            kinds, where = shares(handle.read())
    finally:
        deployment.stop()
    rps = summary["requests"] / (summary["duration_us"] / 1e6)
    return {"kinds": dict(kinds), "where": dict(where), "rps": rps}


def report(sample: float, rounds: List[Dict[str, Any]]) -> str:
    lines = [
        f"tracing_profile: traces recorded {sample:g}; py-spy, the web process's threads, stubbed forward pass",
        "",
        "| round | req/s under py-spy | busy samples | tracing's | share of busy CPU (± s.e.) |",
        "| --: | --: | --: | --: | --: |",
    ]
    busy_all = tracing_all = 0
    where: Counter[str] = collections.Counter()
    for number, found in enumerate(rounds, 1):
        kinds = found["kinds"]
        busy = kinds.get("tracing", 0) + kinds.get("other", 0)
        traced = kinds.get("tracing", 0)
        busy_all, tracing_all = busy_all + busy, tracing_all + traced
        where.update(found["where"])
        lines.append(f"| {number} | {found['rps']:,.0f} | {busy:,} | {traced:,} | {_share(traced, busy)} |")
    lines.append(f"| all | | {busy_all:,} | {tracing_all:,} | **{_share(tracing_all, busy_all)}** |")
    lines += ["", "Tracing's samples by where they entered its code:", ""]
    for name, count in where.most_common(8):
        lines.append(f"- {name}: {count / max(1, busy_all) * 100:.2f}% of busy")
    return "\n".join(lines)


def _share(part: int, whole: int) -> str:
    if whole == 0:
        return "-"
    return f"{part / whole * 100:.2f}% (± {math.sqrt(part) / whole * 100:.2f})"


def parse_args(argv: Optional[Sequence[str]]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sample", type=float, default=0.01, help="the share of traces recorded (default 0.01)")
    parser.add_argument("--rounds", type=int, default=2, help="deployments started and sampled (default 2)")
    parser.add_argument("--duration", type=float, default=20.0, help="seconds of load measured per round")
    parser.add_argument("--warmup", type=float, default=4.0, help="seconds of load before (default 4)")
    parser.add_argument("--connections", type=int, default=128, help="wrk's connections (default 128)")
    parser.add_argument("--rate", type=int, default=200, help="py-spy's samples a second (default 200)")
    parser.add_argument("--json", default="", help="also write the counts here")
    args = parser.parse_args(argv)
    if not 0 < args.sample <= 1:
        parser.error("--sample: a share of traces in (0, 1]")
    # The deployment's settings, as scale_bench's for this one run.
    deployment = scale_args(
        ["--web-workers", "1", "--stub-forward", "--trace-sample", str(args.sample), "--variants",
         "ours-thread-traced", "--plots", ""]
    )  # fmt: skip
    for name, value in vars(deployment).items():
        if not hasattr(args, name):
            setattr(args, name, value)
    args.connections = [args.connections]
    return args


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    py_spy = shutil.which("py-spy") or os.path.join(os.path.dirname(sys.executable), "py-spy")
    if not os.path.exists(py_spy):
        print("tracing_profile needs py-spy: .venv/bin/pip install -e '.[bench]'", file=sys.stderr)
        return 2
    if shutil.which("wrk") is None:
        print("tracing_profile needs wrk: apt-get install -y wrk", file=sys.stderr)
        return 2
    rounds = []
    for number in range(args.rounds):
        with tempfile.TemporaryDirectory(prefix="tracing-profile-") as folder:
            rounds.append(one_round(args, folder, py_spy))
        print(f"[{number + 1}/{args.rounds}] {rounds[-1]['kinds']}", flush=True)
    print(report(args.sample, rounds))
    if args.json:
        with open(args.json, "w") as handle:
            json.dump({"sample": args.sample, "rounds": rounds}, handle, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
