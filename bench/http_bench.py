"""HTTP benchmark with wrk: a no-op view, /naive, /stream and service_streamer
side by side, for each server and model.

For every (server, model) pair the benchmark starts ``bench.apps.http_app`` under
that server as a subprocess on 127.0.0.1 (a process group of its own), waits
until ``GET /info`` answers, then for each number of connections runs
``wrk -t2 -c<connections> -d<duration>`` with ``bench/http_post.lua`` (POST
``{"s": "..."}``) against

* ``/noop``: the same parsing and a constant JSON answer: the server's own
  ceiling on this machine;
* ``/naive``: one model call per request;
* ``/stream``: flask_streamer's batched route (thread backend);
* ``/ss_stream``: service_streamer 0.1.2's ``ThreadedStreamer`` in a view.

Each measured run follows a short unmeasured wrk run on the same endpoint
(warm-up), and waits until the server has worked off what the previous run
left in flight. With ``--repeat N`` every (server, model) session is run N
times, interleaved, and the tables show medians.

Run from the repository root::

    .venv/bin/python -m bench.http_bench --quick
    .venv/bin/python -m bench.http_bench --repeat 3 --duration 8
    .venv/bin/python -m bench.http_bench --servers dev --model zero --connections 64

Progress goes to stderr, the tables (markdown) to stdout. A missed target is
a measurement, not a failure: the exit status is 0 unless the benchmark itself
could not run.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import asdict, dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple

from bench import harness

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LUA_SCRIPT = os.path.join(REPO_ROOT, "bench", "http_post.lua")

SERVERS = ("dev", "gevent", "gevent-patched", "gunicorn")
MODELS = ("sim", "minilm", "zero")
ENDPOINTS = ("noop", "naive", "stream", "ss_stream", "core_stream")
DEFAULT_ENDPOINTS = ("noop", "naive", "stream", "ss_stream")
SERVER_LABELS = {
    "dev": "Flask dev server (threaded)",
    "gevent": "gevent WSGIServer",
    "gevent-patched": "gevent WSGIServer + patch_all",
    "gunicorn": "gunicorn gthread (1 worker)",
}
TARGET_RATIO = 0.85
READY_LIMIT_S = 240.0  # MiniLM: torch import, model load, the batch timing
SETTLE_LIMIT_S = 60.0


# -- one wrk run -------------------------------------------------------------------


@dataclass
class WrkResult:
    """One measured wrk run against one endpoint."""

    server: str
    model: str
    connections: int
    endpoint: str
    rps: float = 0.0
    requests: int = 0
    p50_ms: Optional[float] = None
    p99_ms: Optional[float] = None
    non_2xx: int = 0
    socket_errors: Dict[str, int] = field(default_factory=dict)  # connect/read/write/timeout
    mean_batch: Optional[float] = None
    server_cpu: Optional[float] = None  # % of one core, every thread of the server
    wrk_cpu: Optional[float] = None
    others_cpu: Optional[float] = None  # % of one core used by every other process on the machine
    attempts: int = 1  # measurements taken (a disturbed one is taken again)
    failure: Optional[str] = None
    runs_rps: List[float] = field(default_factory=list)  # every repeat's req/s (summaries)

    @property
    def errors(self) -> int:
        return self.non_2xx + sum(self.socket_errors.values())

    def error_text(self) -> str:
        parts = [f"non-2xx {self.non_2xx}"] if self.non_2xx else []
        parts += [f"{kind} {count}" for kind, count in sorted(self.socket_errors.items()) if count]
        return ", ".join(parts) or "0"


# -- the server under test ----------------------------------------------------------


class Server:
    """``bench.apps.http_app`` under one server, in a subprocess group of its own."""

    def __init__(self, kind: str, model: str, args: argparse.Namespace, log_dir: str) -> None:
        self.kind, self.model = kind, model
        self.port = harness.free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        env = dict(
            os.environ,
            BENCH_HTTP_MODEL=model,
            BENCH_HTTP_BATCH_SIZE=str(args.batch_size),
            BENCH_HTTP_MAX_LATENCY=str(args.max_latency),
            BENCH_HTTP_FIXED_MS=str(args.fixed_ms),
            BENCH_HTTP_PER_ITEM_MS=str(args.per_item_ms),
            BENCH_HTTP_SERVER=kind,
            BENCH_HTTP_NODELAY="0" if args.gevent_nagle else "1",
            PYTHONUNBUFFERED="1",
        )
        if kind == "gunicorn":
            threads = max(args.connections)  # one thread per connection, as the dev server has
            command = [
                sys.executable,
                "-m",
                "gunicorn",
                "-w",
                "1",
                "-k",
                "gthread",
                "--threads",
                str(threads),
                "--backlog",
                "2048",
                "-b",
                f"127.0.0.1:{self.port}",
                "--log-level",
                "warning",
                "bench.apps.http_app:create_app()",
            ]
        else:
            command = [sys.executable, "-m", "bench.apps.http_server", kind, str(self.port)]
        self.log_path = os.path.join(log_dir, f"{kind}-{model}-{self.port}.log")
        self._log = open(self.log_path, "w")
        self.process = subprocess.Popen(
            command, cwd=REPO_ROOT, env=env, stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True
        )
        self.info: Dict[str, Any] = {}

    def get(self, path: str, timeout: float = 2.0) -> Dict[str, Any]:
        with urllib.request.urlopen(self.base + path, timeout=timeout) as response:
            return json.loads(response.read())

    def wait_ready(self) -> None:
        deadline = time.monotonic() + READY_LIMIT_S
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"the server exited with {self.process.returncode}: {self.log_tail()}")
            try:
                self.info = self.get("/info")
                return
            except OSError:
                time.sleep(0.2)
        raise RuntimeError(f"the server did not answer within {READY_LIMIT_S:.0f}s: {self.log_tail()}")

    def settle(self) -> float:
        """Wait until the server has no request in flight but the one asking:
        whatever the previous run left behind (wrk closes its connections,
        the server still works off their requests) is done. The seconds waited."""
        started = time.monotonic()
        while time.monotonic() - started < SETTLE_LIMIT_S:
            try:
                if self.get("/info", timeout=SETTLE_LIMIT_S)["in_flight"] <= 0:
                    break
            except OSError:
                pass
            time.sleep(0.05)
        return time.monotonic() - started

    def counts(self) -> Dict[str, List[int]]:
        return self.get("/info", timeout=10.0)["counts"]

    def cpu_ticks(self) -> int:
        return harness.cpu_ticks(self.process.pid)

    def log_tail(self) -> str:
        self._log.flush()
        with open(self.log_path) as handle:
            return handle.read()[-1500:]

    def stop(self) -> None:
        for sig, wait_s in ((signal.SIGTERM, 5.0), (signal.SIGKILL, 5.0)):
            try:
                os.killpg(self.process.pid, sig)
            except (ProcessLookupError, PermissionError):
                break
            try:
                self.process.wait(wait_s)
                if sig == signal.SIGTERM:
                    try:  # anything the server left in its group
                        os.killpg(self.process.pid, signal.SIGKILL)
                    except (ProcessLookupError, PermissionError):
                        pass
                break
            except subprocess.TimeoutExpired:
                continue
        self._log.close()


def wait_for_quiet(limit_pct: float, max_wait_s: float) -> float:
    """Wait (up to ``max_wait_s``) until the machine, our idle server aside,
    is quiet: under ``limit_pct`` % of one core busy over a second. Other
    sessions' tests share these cores. Returns the seconds waited."""
    clk_tck = os.sysconf("SC_CLK_TCK")
    started = time.monotonic()
    while True:
        before = harness.machine_busy_ticks()
        time.sleep(1.0)
        busy_pct = 100.0 * (harness.machine_busy_ticks() - before) / clk_tck
        if busy_pct < limit_pct or time.monotonic() - started >= max_wait_s:
            return time.monotonic() - started


def measure(server: Server, endpoint: str, connections: int, args: argparse.Namespace, body: str) -> WrkResult:
    """One measured run on ``endpoint``, taken again (up to ``--retries``
    times) while other processes used more than ``--max-others`` % of a core
    during it; the least disturbed attempt is kept."""
    best: Optional[WrkResult] = None
    for attempt in range(1 + args.retries):
        if args.quiet_wait > 0:
            waited = wait_for_quiet(args.max_others, args.quiet_wait)
            if waited > 2:
                print(f"    (waited {waited:.0f} s for the machine to quieten)", file=sys.stderr, flush=True)
        result = measure_once(server, endpoint, connections, args, body)
        result.attempts = attempt + 1
        if result.failure:
            return result
        if best is None or (result.others_cpu or 0.0) < (best.others_cpu or 0.0):
            best = result
        if (result.others_cpu or 0.0) <= args.max_others:
            break
        print(
            f"    (others used {result.others_cpu:.0f}% of a core during /{endpoint}: again)",
            file=sys.stderr,
            flush=True,
        )
    assert best is not None
    best.attempts = result.attempts
    return best


def measure_once(server: Server, endpoint: str, connections: int, args: argparse.Namespace, body: str) -> WrkResult:
    """Warm up, then one measured wrk run on ``endpoint``."""
    result = WrkResult(server.kind, server.model, connections, endpoint)
    url = f"{server.base}/{endpoint}"
    clk_tck = os.sysconf("SC_CLK_TCK")
    try:
        server.settle()
        if args.warmup > 0:
            harness.run_wrk(url, connections, args.warmup, args.wrk_timeout, body)
            server.settle()
        counts_before = server.counts().get(endpoint)
        busy_before, ticks_before, started = harness.machine_busy_ticks(), server.cpu_ticks(), time.monotonic()
        summary, wrk_cpu_s = harness.run_wrk(url, connections, args.duration, args.wrk_timeout, body)
        elapsed = time.monotonic() - started
        ticks_after, busy_after = server.cpu_ticks(), harness.machine_busy_ticks()
        server.settle()
        counts_after = server.counts().get(endpoint)
    except (OSError, RuntimeError, subprocess.TimeoutExpired) as exc:
        result.failure = f"{type(exc).__name__}: {exc}"
        return result
    seconds = summary["duration_us"] / 1e6
    result.requests = summary["requests"]
    result.rps = summary["requests"] / seconds if seconds > 0 else 0.0
    result.p50_ms = summary["lat_p50_us"] / 1000.0 if summary["requests"] else None
    result.p99_ms = summary["lat_p99_us"] / 1000.0 if summary["requests"] else None
    result.non_2xx = summary["status"]
    result.socket_errors = {kind: summary[kind] for kind in ("connect", "read", "write", "timeout") if summary[kind]}
    if counts_before is not None and counts_after is not None:
        batches = counts_after[0] - counts_before[0]
        items = counts_after[1] - counts_before[1]
        result.mean_batch = items / batches if batches else None
    result.server_cpu = 100.0 * (ticks_after - ticks_before) / clk_tck / elapsed
    result.wrk_cpu = 100.0 * wrk_cpu_s / elapsed
    others = (busy_after - busy_before - (ticks_after - ticks_before)) / clk_tck - wrk_cpu_s
    result.others_cpu = max(0.0, 100.0 * others / elapsed)
    return result


def run_session(
    kind: str, model: str, args: argparse.Namespace, log_dir: str, body: str
) -> Tuple[List[WrkResult], Dict[str, Any]]:
    """Start one server with one model, measure every endpoint at every
    connection count, stop it. The results and the server's ``/info``."""
    server = Server(kind, model, args, log_dir)
    results: List[WrkResult] = []
    try:
        try:
            server.wait_ready()
        except RuntimeError as exc:
            failed = [WrkResult(kind, model, c, e, failure=str(exc)) for c in args.connections for e in args.endpoints]
            return failed, {}
        for connections in args.connections:
            for endpoint in args.endpoints:
                result = measure(server, endpoint, connections, args, body)
                results.append(result)
                line = result.failure or (
                    f"{result.rps:.0f} req/s, p50 {_fmt(result.p50_ms)} ms, p99 {_fmt(result.p99_ms)} ms, "
                    f"batch {_fmt(result.mean_batch)}, server CPU {_fmt(result.server_cpu, 0)}%, "
                    f"wrk CPU {_fmt(result.wrk_cpu, 0)}%, others {_fmt(result.others_cpu, 0)}%, "
                    f"errors {result.error_text()}"
                )
                print(f"  {kind} {model} c={connections} /{endpoint}: {line}", file=sys.stderr, flush=True)
        return results, server.info
    finally:
        server.stop()


# -- summaries and tables ------------------------------------------------------------


def _fmt(value: Optional[float], digits: int = 1) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def summarize(runs: List[WrkResult]) -> WrkResult:
    """The run with the median req/s stands for all; errors are summed over every run."""
    ok = [run for run in runs if not run.failure]
    if not ok:
        return runs[0]
    ordered = sorted(ok, key=lambda run: run.rps)
    summary = WrkResult(**asdict(ordered[len(ordered) // 2]))  # its latencies, batch, CPU stand for all
    summary.rps = statistics.median(run.rps for run in ok)
    summary.non_2xx = sum(run.non_2xx for run in ok)
    errors: Dict[str, int] = {}
    for run in ok:
        for kind, count in run.socket_errors.items():
            errors[kind] = errors.get(kind, 0) + count
    if len(ok) < len(runs):
        errors["failed runs"] = len(runs) - len(ok)
    summary.socket_errors = errors
    summary.runs_rps = [run.rps for run in ok]
    return summary


def _rps_cell(result: Optional[WrkResult]) -> str:
    if result is None:
        return "-"
    if result.failure:
        return "FAILED"
    text = f"{result.rps:.0f}"
    if len(result.runs_rps) > 1:
        text += f" ({min(result.runs_rps):.0f}-{max(result.runs_rps):.0f})"
    return text


def ideal_text(ideal: Optional[float]) -> str:
    return "∞" if ideal is None or ideal == float("inf") else f"{ideal:.0f}"


def verdict(stream: Optional[WrkResult], noop: Optional[WrkResult], ideal: Optional[float]) -> Tuple[str, str]:
    """(stream / ceiling, PASS/MISS or why the target does not apply)."""
    if stream is None or noop is None or stream.failure or noop.failure or not noop.rps:
        return "-", "n/a"
    ratio = stream.rps / noop.rps
    errors = stream.errors
    if ideal is not None and ideal <= noop.rps:
        return f"{ratio:.3f}", f"n/a (ideal {ideal:.0f} ≤ ceiling); /stream = {stream.rps / ideal:.2f} of ideal"
    mark = "PASS" if ratio >= TARGET_RATIO and errors == 0 else "MISS"
    if errors:
        mark += f" ({errors} errors)"
    return f"{ratio:.3f}", mark


def tables(
    summaries: Dict[Tuple[str, str, int, str], WrkResult],
    ideals: Dict[Tuple[str, str], Optional[float]],
    args: argparse.Namespace,
) -> str:
    lines = [
        "| server | model | conns | ideal req/s | /noop (ceiling) | /naive | /stream | /ss_stream "
        "| /stream ÷ ceiling | /ss_stream ÷ ceiling | target: /stream ≥ 0.85 × ceiling |",
        "|---|---|--:|--:|--:|--:|--:|--:|--:|--:|---|",
    ]
    for kind in args.servers:
        for model in args.models:
            ideal = ideals.get((kind, model))
            for connections in args.connections:
                row = {e: summaries.get((kind, model, connections, e)) for e in ENDPOINTS}
                ratio, mark = verdict(row["stream"], row["noop"], ideal)
                ss_ratio = "-"
                if row["ss_stream"] and row["noop"] and not row["ss_stream"].failure and row["noop"].rps:
                    ss_ratio = f"{row['ss_stream'].rps / row['noop'].rps:.3f}"
                lines.append(
                    f"| {kind} | {model} | {connections} | {ideal_text(ideal)} | {_rps_cell(row['noop'])} "
                    f"| {_rps_cell(row['naive'])} | {_rps_cell(row['stream'])} | {_rps_cell(row['ss_stream'])} "
                    f"| {ratio} | {ss_ratio} | {mark} |"
                )
    lines += [
        "",
        "| server | model | conns | endpoint | req/s | p50 ms | p99 ms | mean batch | server CPU % "
        "| server CPU ms / req | wrk CPU % | others' CPU % | errors |",
        "|---|---|--:|---|--:|--:|--:|--:|--:|--:|--:|--:|---|",
    ]
    for kind in args.servers:
        for model in args.models:
            for connections in args.connections:
                for endpoint in args.endpoints:
                    result = summaries.get((kind, model, connections, endpoint))
                    if result is None:
                        continue
                    if result.failure:
                        lines.append(
                            f"| {kind} | {model} | {connections} | /{endpoint} | FAILED: {result.failure} "
                            "| | | | | | | | |"
                        )
                        continue
                    cpu_ms = None
                    if result.server_cpu is not None and result.rps:
                        cpu_ms = result.server_cpu * 10.0 / result.rps
                    lines.append(
                        f"| {kind} | {model} | {connections} | /{endpoint} | {_rps_cell(result)} "
                        f"| {_fmt(result.p50_ms)} | {_fmt(result.p99_ms)} | {_fmt(result.mean_batch)} "
                        f"| {_fmt(result.server_cpu, 0)} | {_fmt(cpu_ms, 2)} | {_fmt(result.wrk_cpu, 0)} "
                        f"| {_fmt(result.others_cpu, 0)} | {result.error_text()} |"
                    )
    return "\n".join(lines)


# -- the command line ------------------------------------------------------------------


def _list(value: str, allowed: Sequence[str], what: str) -> List[str]:
    items = [item.strip() for item in value.split(",") if item.strip()]
    wrong = [item for item in items if item not in allowed]
    if wrong or not items:
        raise argparse.ArgumentTypeError(f"{what}: choose from {', '.join(allowed)} (got {value!r})")
    return items


def parse_args(argv: Optional[Sequence[str]]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.http_bench",
        description="HTTP benchmark with wrk: /noop, /naive, /stream and service_streamer's ThreadedStreamer "
        "on each server, side by side.",
    )
    parser.add_argument("--repeat", type=int, help="runs of every (server, model) session, interleaved (default 1)")
    parser.add_argument("--duration", type=float, help="measured seconds per wrk run (default 8)")
    parser.add_argument("--warmup", type=float, help="seconds of unmeasured load before each run (default 1; 0: none)")
    parser.add_argument("--connections", help="comma-separated wrk connection counts (default 64,128)")
    parser.add_argument(
        "--servers", help=f"comma-separated, of {','.join(SERVERS)} (default dev,gevent,gevent-patched)"
    )
    parser.add_argument("--model", dest="models", help=f"comma-separated, of {','.join(MODELS)} (default sim,minilm)")
    parser.add_argument(
        "--endpoints", help=f"comma-separated, of {','.join(ENDPOINTS)} (default: all but core_stream, a diagnostic)"
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="a smoke run: 2 s runs, 0.5 s warm-up, sim only, 128 connections (explicit options win)",
    )
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--max-latency", type=float, default=0.1, help="seconds, both libraries (default 0.1)")
    parser.add_argument("--fixed-ms", type=float, default=10.0, help="sim: ms per batch (default 10)")
    parser.add_argument("--per-item-ms", type=float, default=0.2, help="sim: ms per item (default 0.2)")
    parser.add_argument("--wrk-timeout", type=float, default=10.0, help="wrk's --timeout in seconds (default 10)")
    parser.add_argument(
        "--max-others",
        type=float,
        default=30.0,
        help="%% of one core other processes may use during a run before it is taken again (default 30)",
    )
    parser.add_argument("--retries", type=int, default=2, help="times a disturbed run is taken again (default 2)")
    parser.add_argument(
        "--quiet-wait",
        type=float,
        default=60.0,
        help="seconds to wait at most, before each run, for the machine to be quiet (default 60; 0: never)",
    )
    parser.add_argument(
        "--gevent-nagle",
        action="store_true",
        help="leave Nagle's algorithm on for gevent's connections, as WSGIServer does by default "
        "(a ~40 ms stall per keep-alive response; see the README)",
    )
    parser.add_argument("--json", metavar="PATH", help="also write every run as JSON here")
    parser.add_argument("--from-json", metavar="PATH", help="print the tables of a run saved with --json, and exit")
    args = parser.parse_args(argv)
    quick = args.quick
    args.repeat = args.repeat or 1
    args.duration = args.duration or (2.0 if quick else 8.0)
    args.warmup = args.warmup if args.warmup is not None else (0.5 if quick else 1.0)
    try:
        args.connections = [
            int(c) for c in (args.connections or ("128" if quick else "64,128")).split(",") if c.strip()
        ]
        args.servers = _list(args.servers or "dev,gevent,gevent-patched", SERVERS, "--servers")
        args.models = _list(args.models or ("sim" if quick else "sim,minilm"), MODELS, "--model")
        args.endpoints = _list(args.endpoints or ",".join(DEFAULT_ENDPOINTS), ENDPOINTS, "--endpoints")
    except (ValueError, argparse.ArgumentTypeError) as exc:
        parser.error(str(exc))
    if args.repeat < 1 or args.duration < 1 or any(c < 1 for c in args.connections):
        parser.error("--repeat, --duration and --connections must be at least 1")
    return args


def report(
    args: argparse.Namespace,
    header: str,
    runs: Dict[Tuple[str, str, int, str], List[WrkResult]],
    infos: Dict[Tuple[str, str], List[Dict[str, Any]]],
) -> str:
    """The tables (markdown) and the models' notes, from every run."""
    summaries = {key: summarize(value) for key, value in runs.items()}
    # One ideal per model: the median over every server start (MiniLM is timed at each).
    ideals: Dict[Tuple[str, str], Optional[float]] = {}
    for model in args.models:
        values = [
            info["ideal_rps"] for (_, m), seen in infos.items() if m == model for info in seen if info.get("ideal_rps")
        ]
        for kind in args.servers:
            ideals[(kind, model)] = statistics.median(values) if values else None
    details = []
    for model in args.models:
        seen = [info for (_, m), value in infos.items() if m == model for info in value]
        if not seen:
            continue
        line = f"{model}: {seen[0]['model_detail']}"
        batch_ms = [info["batch_ms"] for info in seen]
        if len(set(batch_ms)) > 1:  # timed at every start: say how much that varied
            line += (
                f"; over the {len(seen)} server starts, the best batch time ranged "
                f"{min(batch_ms):.0f}-{max(batch_ms):.0f} ms (ideal from the median)"
            )
        details.append(line)
    return "\n".join([header, "", tables(summaries, ideals, args), ""] + [f"* {line}" for line in details])


def _from_json(
    path: str,
) -> Tuple[
    argparse.Namespace,
    str,
    Dict[Tuple[str, str, int, str], List[WrkResult]],
    Dict[Tuple[str, str], List[Dict[str, Any]]],
]:
    """What ``--json`` wrote, to print its tables again."""
    with open(path) as handle:
        document = json.load(handle)
    args = argparse.Namespace(**document["args"])
    runs: Dict[Tuple[str, str, int, str], List[WrkResult]] = {}
    for raw in document["runs"]:
        result = WrkResult(**raw)
        runs.setdefault((result.server, result.model, result.connections, result.endpoint), []).append(result)
    infos = {tuple(key.split("/", 1)): value for key, value in document["infos"].items()}
    return args, document["header"], runs, infos  # type: ignore[return-value]


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    if args.from_json:
        saved_args, header, runs, infos = _from_json(args.from_json)
        print(report(saved_args, header, runs, infos))
        return 0
    if shutil.which("wrk") is None:
        print("wrk is not installed (apt-get install wrk)", file=sys.stderr)
        return 2
    from bench.apps.http_app import SENTENCE

    body = json.dumps({"s": SENTENCE})
    header = (
        f"wrk -t2, {args.duration:g} s per run after {args.warmup:g} s warm-up, {args.repeat} run(s) each "
        f"(median); batch {args.batch_size}, max_latency {args.max_latency:g} s; sim = {args.fixed_ms:g} ms + "
        f"{args.per_item_ms:g} ms/item; gevent {'with Nagle (as is)' if args.gevent_nagle else 'with TCP_NODELAY'}; "
        f"{os.cpu_count()} CPUs, Python {platform.python_version()}"
    )
    print(header, file=sys.stderr)
    started = time.monotonic()
    runs: Dict[Tuple[str, str, int, str], List[WrkResult]] = {}
    infos: Dict[Tuple[str, str], List[Dict[str, Any]]] = {}
    log_dir = tempfile.mkdtemp(prefix="bench-http-")
    try:
        for number in range(1, args.repeat + 1):
            for kind in args.servers:
                for model in args.models:
                    print(
                        f"[run {number}/{args.repeat}] {SERVER_LABELS[kind]}, model {model}",
                        file=sys.stderr,
                        flush=True,
                    )
                    results, info = run_session(kind, model, args, log_dir, body)
                    for result in results:
                        runs.setdefault((kind, model, result.connections, result.endpoint), []).append(result)
                    if info:
                        infos.setdefault((kind, model), []).append(info)
    finally:
        shutil.rmtree(log_dir, ignore_errors=True)
    elapsed = time.monotonic() - started

    print()
    print(report(args, header, runs, infos))
    print(f"\n(total {elapsed:.0f} s)")
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as handle:
            json.dump(
                {
                    "header": header,
                    "args": vars(args),
                    "infos": {f"{k[0]}/{k[1]}": v for k, v in infos.items()},
                    "runs": [asdict(run) for value in runs.values() for run in value],
                },
                handle,
                indent=2,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
