"""How many requests one Redis carries: the broker's CPU per request.

Web processes (``RedisStreamer``, no HTTP: each keeps ``--in-flight`` calls
of one input open, a new one as each is answered) and workers
(``streamer-worker`` with a model that answers at once) meet at a private
``redis-server``, so that the broker is the part under test. Over a
measured window this reads, from /proc, the CPU time redis-server spent
and divides it by the requests answered: microseconds of Redis CPU per
request, and so the requests one Redis core carries (Redis runs commands
on one thread). It reports the CPU of the web processes and workers too,
since on a small machine they, not Redis, set the rate.

Run from the repository root::

    .venv/bin/python -m bench.broker_bench                       # the default grid
    .venv/bin/python -m bench.broker_bench --web 4 --in-flight 512 --workers 2 --duration 10

Every process is started here, in a process group of its own, and killed
at the end whatever happens; traffic goes only to 127.0.0.1.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from typing import Any, List, Optional, Sequence

from bench import harness

PREFIX = "capacity"
#: Issue #32's floor: Redis CPU per request, microseconds.
FLOOR_US = 25.0
#: Calls in flight per web process from which a run counts as load.
LOADED_IN_FLIGHT = 256
READY_LIMIT_S = 60.0


def echo(batch: List[Any]) -> List[Any]:
    """The workers' model: answers at once, so the broker is what costs."""
    return batch


@dataclass
class Config:
    web: int
    in_flight: int
    workers: int
    batch_size: int


@dataclass
class Measured:
    config: Config
    answered: int
    errors: int
    seconds: float
    redis_s: float
    web_s: float
    workers_s: float

    @property
    def rps(self) -> float:
        return self.answered / self.seconds

    def per_request_us(self, cpu_s: float) -> float:
        return cpu_s / max(1, self.answered) * 1e6


def child(url: str, in_flight: int, start_at: float, end_at: float, out: str) -> int:
    """One web process: keep ``in_flight`` calls open until ``end_at``;
    write how many were answered (and failed) inside [start_at, end_at]."""
    from streamer_core import RedisStreamer

    streamer = RedisStreamer(url, PREFIX, timeout=30)
    slots = threading.BoundedSemaphore(in_flight)
    counts = {"answered": 0, "errors": 0}
    lock = threading.Lock()

    def done(future: Any) -> None:
        now = time.time()
        failed = future.exception() is not None
        if start_at <= now <= end_at:
            with lock:
                counts["errors" if failed else "answered"] += 1
        slots.release()

    try:
        x = 0
        while time.time() < end_at:
            if not slots.acquire(timeout=1.0):
                continue
            x += 1
            streamer.submit([x]).add_done_callback(done)
        time.sleep(0.5)
    finally:
        with open(out, "w") as handle:
            json.dump(counts, handle)
        streamer.close(timeout=5)
    return 0


def run(config: Config, duration_s: float, warmup_s: float, folder: str) -> Measured:
    executable = shutil.which("redis-server")
    if executable is None:
        raise SystemExit("broker_bench needs redis-server on PATH (apt-get install redis-server)")
    server = harness.PrivateRedis(executable, folder)
    server.start()
    url = f"redis://127.0.0.1:{server.port}/0"
    assert server.proc is not None
    env = {**os.environ, "PYTHONPATH": harness.REPO_ROOT}
    worker_cmd = [
        sys.executable, "-m", "streamer_core.cli", "bench.broker_bench:echo", "--workers", str(config.workers),
        "--batch-size", str(config.batch_size), "--max-latency", "0.002", "--prefix", PREFIX, "--redis", url,
    ]  # fmt: skip
    workers = subprocess.Popen(
        worker_cmd, cwd=harness.REPO_ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        start_new_session=True,
    )  # fmt: skip
    harness.LIVE.add(workers)
    webs: List[subprocess.Popen] = []
    try:
        from streamer_core import RedisStreamer

        probe = RedisStreamer(url, PREFIX, timeout=30)
        try:
            deadline = time.monotonic() + READY_LIMIT_S
            while probe.live_workers() < config.workers:
                if time.monotonic() > deadline or workers.poll() is not None:
                    raise RuntimeError("the workers did not start")
                time.sleep(0.2)
        finally:
            probe.close()
        start_at = time.time() + warmup_s + 1.0  # the children's start-up too
        end_at = start_at + duration_s
        outs = [os.path.join(folder, f"web-{i}.json") for i in range(config.web)]
        for out in outs:
            web = subprocess.Popen(
                [sys.executable, "-m", "bench.broker_bench", "--child", url, str(config.in_flight),
                 repr(start_at), repr(end_at), out],
                cwd=harness.REPO_ROOT, env=env, start_new_session=True,
            )  # fmt: skip
            harness.LIVE.add(web)
            webs.append(web)
        time.sleep(max(0.0, start_at - time.time()))
        before = (harness.cpu_ticks(server.proc.pid), sum(harness.cpu_ticks(w.pid) for w in webs))
        before_workers = harness.cpu_ticks(workers.pid)
        time.sleep(max(0.0, end_at - time.time()))
        after = (harness.cpu_ticks(server.proc.pid), sum(harness.cpu_ticks(w.pid) for w in webs))
        after_workers = harness.cpu_ticks(workers.pid)
        for web in webs:
            web.wait(60)
        counts = [json.load(open(out)) for out in outs]
        tick = harness.CLOCK_TICKS
        return Measured(
            config,
            answered=sum(c["answered"] for c in counts),
            errors=sum(c["errors"] for c in counts),
            seconds=end_at - start_at,
            redis_s=(after[0] - before[0]) / tick,
            web_s=(after[1] - before[1]) / tick,
            workers_s=(after_workers - before_workers) / tick,
        )
    finally:
        for process in (*webs, workers):
            harness.kill(process)
        server.stop()


def table(results: Sequence[Measured]) -> str:
    lines = [
        "| web processes x calls in flight | workers (batch) | req/s | errors | Redis CPU µs/req | Redis core busy "
        "| one Redis core carries (req/s) | web CPU µs/req | workers CPU µs/req |",
        "| --- | --- | --: | --: | --: | --: | --: | --: | --: |",
    ]
    for m in results:
        redis_us = m.per_request_us(m.redis_s)
        lines.append(
            f"| {m.config.web} x {m.config.in_flight} | {m.config.workers} ({m.config.batch_size}) | {m.rps:,.0f} "
            f"| {m.errors} | {redis_us:.1f} | {m.redis_s / m.seconds:.0%} | {1e6 / redis_us:,.0f} "
            f"| {m.per_request_us(m.web_s):.0f} | {m.per_request_us(m.workers_s):.0f} |"
        )
    # A Redis near its capacity has deep queues, so each web process sends
    # (and each worker reads) large bursts: the floor is read where callers
    # keep at least a few batches in flight. With few callers Redis is mostly
    # idle and each request carries more of a command's fixed cost (shown).
    loaded = [m.per_request_us(m.redis_s) for m in results if m.config.in_flight >= LOADED_IN_FLIGHT]
    if loaded:
        verdict = "PASS" if max(loaded) <= FLOOR_US else "MISS"
        lines += [
            "",
            "| floor | measured | verdict |",
            "| --- | --: | --- |",
            f"| Redis CPU per request <= {FLOOR_US:g} µs (one core >= {1e6 / FLOOR_US:,.0f} req/s), rows with "
            f">= {LOADED_IN_FLIGHT} calls in flight per web process "
            f"| {min(loaded):.1f}-{max(loaded):.1f} µs | {verdict} |",
        ]
    return "\n".join(lines)


def parse_args(argv: Optional[Sequence[str]]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.broker_bench", description=__doc__.split("\n\n")[0])
    parser.add_argument("--web", type=int, default=0, help="web processes (default: the grid)")
    parser.add_argument("--in-flight", type=int, default=256, help="calls each web process keeps open")
    parser.add_argument("--workers", type=int, default=1, help="worker processes")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--duration", type=float, default=8.0, help="measured seconds per run")
    parser.add_argument("--warmup", type=float, default=3.0, help="seconds of load before each window")
    parser.add_argument("--json", default="", help="also write the runs here")
    return parser.parse_args(argv)


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--child"]:
        url, in_flight, start_at, end_at, out = argv[1:6]
        return child(url, int(in_flight), float(start_at), float(end_at), out)
    args = parse_args(argv)
    if args.web:
        grid = [Config(args.web, args.in_flight, args.workers, args.batch_size)]
    else:  # a burst of a few callers, and bursts of a full batch and more
        grid = [Config(1, 16, 1, 64), Config(1, 256, 1, 64), Config(2, 256, 2, 64), Config(2, 1024, 2, 256)]
    print(f"broker_bench: {len(grid)} run(s) of {args.duration:g} s, {os.cpu_count()} cores", file=sys.stderr)
    results = []
    with tempfile.TemporaryDirectory(prefix="broker-bench-") as folder:
        for config in grid:
            measured = run(config, args.duration, args.warmup, folder)
            print(
                f"  {config}: {measured.rps:,.0f} req/s, Redis {measured.per_request_us(measured.redis_s):.1f} µs/req",
                file=sys.stderr,
                flush=True,
            )
            results.append(measured)
    print(table(results))
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(
                [{**vars(m.config), **{k: v for k, v in vars(m).items() if k != "config"}} for m in results], handle
            )
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    finally:
        harness.kill_everything_left()
