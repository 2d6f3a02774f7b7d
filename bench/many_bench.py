"""Many inputs per request: what the OpenAI embeddings API of the example
serves at 1, 8, 32 and 128 inputs a request, beside infinity-emb on the
same model.

    apt-get install -y wrk
    .venv/bin/pip install -e '.[example,bench]'
    .venv/bin/python -m bench.many_bench                          # the real model: 3-4 minutes on 2 cores
    .venv/bin/python -m bench.many_bench --stub-forward           # what an input costs outside the forward pass
    .venv/bin/python -m bench.many_bench --infinity PATH/TO/VENV  # infinity-emb beside it (see below)
    .venv/bin/python -m bench.many_bench --repeat 3 ...           # interleaved rounds, the median shown

The example (``example_flask``, the thread backend, gunicorn with its own
``gunicorn.conf.py``, ``--web-workers`` processes) answers ``POST
/v1/embeddings`` with a JSON body of N distinct sentences; wrk keeps the
same number of inputs in flight whatever N (``--inputs-in-flight``, 128 by
default: 128 connections of one input, 4 of 32), for ``--duration`` seconds
after ``--warmup``. For each N: inputs/s, p50 and p99 of a request, and the
server's CPU per input (its whole process tree, from /proc).
``--stub-forward`` replaces the transformer's forward pass by one that
answers at once (the tokenizer and all around it still run: see
``bench/apps/stub_forward``).

``--infinity VENV`` runs infinity-emb's ``infinity_emb v2`` from that
virtual environment on the same model directory and the same load, at its
``/embeddings`` (one server process, the torch engine on the CPU, batches
of 64). ``--stub-forward`` does not reach its engine: compare with it on
the real model only. Made with (infinity-emb pins nothing of torch: give it
the CPU build)::

    python3 -m venv /path/infinity && /path/infinity/bin/pip install torch==2.13.0 'infinity-emb[server,torch]==0.0.78'

``--repeat N`` runs N rounds, each starting every server afresh in turn
(ours, then infinity-emb), and shows for each server and N the run of
median inputs/s with the range over all rounds: on a shared 2-core machine
one run of a server can be a third off the next.

``--beside-large N`` measures what a large request does to the small
ones after it: while wrk sends its requests, one more client sends
requests of N inputs back to back (one at a time), and the table gets a
row for them (their inputs/s and p50/p99, from Python's clock). With
``--code PATH`` the server runs the library and example of another
checkout (a worktree of an earlier commit, say), for a before and after::

    .venv/bin/python -m bench.many_bench --per-request 1 --inputs-in-flight 8 --beside-large 512
    .venv/bin/python -m bench.many_bench --per-request 1 --inputs-in-flight 8 --beside-large 512 --code ../before

``--backend redis`` serves the example on the Redis backend: a
redis-server of the run's own and one worker process (``flask streamer
run-workers``), their CPU counted with the server's.

The floors of issue #40 are printed, PASS or MISS, never asserted.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

from bench import harness

STUB_PATH = os.path.join(harness.REPO_ROOT, "bench", "apps", "stub_forward")
MODEL = "all-MiniLM-L6-v2"
READY_LIMIT_S = 300.0
#: Issue #40's floors: at 32 inputs a request, the real model, at least the
#: rate of one input a request, and 1.2 times infinity-emb's; with the
#: forward pass stubbed, at most this much server CPU per input.
FLOOR_VS_ONE = 1.0
FLOOR_VS_INFINITY = 1.2
FLOOR_CPU_MS = 0.15
WORDS = "the quick brown fox jumps over a lazy dog while seven sleepy cats watch from an open window".split()


def sentences(count: int) -> List[str]:
    """``count`` distinct sentences of about 15 words."""
    return [" ".join(WORDS[(n + k) % len(WORDS)] for k in range(15)) + f" ({n})." for n in range(count)]


@dataclass
class Run:
    server: str
    per_request: int
    inputs_per_s: float = 0.0
    p50_ms: Optional[float] = None
    p99_ms: Optional[float] = None
    errors: int = 0
    cpu_ms_per_input: float = 0.0
    failure: Optional[str] = None
    #: every round's inputs/s, with --repeat (this run is the median one)
    rounds: List[float] = field(default_factory=list)


@dataclass
class Server:
    """One server, in a process group of its own."""

    name: str
    args: argparse.Namespace
    folder: str
    port: int = field(default_factory=harness.free_port)
    process: Optional[subprocess.Popen] = None
    #: ``--backend redis``: its redis-server and the workers (``flask streamer run-workers``).
    redis: Optional[harness.PrivateRedis] = None
    workers: Optional[subprocess.Popen] = None

    @property
    def path(self) -> str:
        return "/v1/embeddings" if self.name == "ours" else "/embeddings"

    def start(self) -> None:
        env = {key: value for key, value in os.environ.items() if not key.startswith(("FLASK_", "STREAMER_"))}
        code = self.args.code or harness.REPO_ROOT
        paths = [code] + ([STUB_PATH] if self.args.stub_forward else [])
        env["PYTHONPATH"] = os.pathsep.join(paths)
        env.update(PYTHONUNBUFFERED="1", TOKENIZERS_PARALLELISM="false")
        if self.name == "ours":
            env.update(FLASK_STREAMER_BACKEND=self.args.backend, WEB_CONCURRENCY=str(self.args.web_workers))
            for setting in self.args.setting:
                name, _, value = setting.partition("=")
                env[f"FLASK_{name}"] = value
            if self.args.stub_forward:
                env.setdefault("PIN_WORKERS", "1")
            if self.args.backend == "redis":
                self.start_redis(env, code)
            command = [sys.executable, "-m", "gunicorn", "-c", "example_flask/gunicorn.conf.py", "-b",
                       f"127.0.0.1:{self.port}", "--log-level", "warning", "example_flask:create_app()"]  # fmt: skip
            if self.args.server == "granian":
                threads = str(max(8, self.args.inputs_in_flight + 8))
                command = [sys.executable, "-m", "granian", "--interface", "wsgi", "--host", "127.0.0.1", "--port",
                           str(self.port), "--workers", str(self.args.web_workers), "--blocking-threads", threads,
                           "--no-ws", "--log-level", "warning", "example_flask.wsgi:app"]  # fmt: skip
        else:
            from example_models.embedding import resolve_model

            env.update(HF_HUB_OFFLINE="1", INFINITY_ANONYMOUS_USAGE_STATS="0")
            command = [os.path.join(self.args.infinity, "bin", "infinity_emb"), "v2", "--model-id",
                       resolve_model(MODEL), "--served-model-name", MODEL, "--host", "127.0.0.1", "--port",
                       str(self.port), "--engine", "torch", "--device", "cpu", "--batch-size", "64",
                       "--no-bettertransformer", "--no-vector-disk-cache",
                       "--dtype", self.args.infinity_dtype]  # fmt: skip
        log = open(os.path.join(self.folder, f"{self.name}.log"), "w")  # noqa: SIM115 - closed with the process
        folder = code if self.name == "ours" else harness.REPO_ROOT
        self.process = subprocess.Popen(
            command, cwd=folder, env=env, stdout=log, stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL, start_new_session=True,
        )  # fmt: skip
        harness.LIVE.add(self.process)

    def start_redis(self, env: Dict[str, str], code: str) -> None:
        """A redis-server of this run and one worker process of the example's."""
        self.redis = harness.PrivateRedis(shutil.which("redis-server") or "redis-server", self.folder)
        self.redis.start()
        env.update(FLASK_STREAMER_REDIS_URL=f"redis://127.0.0.1:{self.redis.port}/0", FLASK_STREAMER_PREFIX="many")
        log = open(os.path.join(self.folder, "workers.log"), "w")  # noqa: SIM115 - closed with the process
        self.workers = subprocess.Popen(
            [sys.executable, "-m", "flask", "--app", "example_flask", "streamer", "run-workers", "--workers", "1"],
            cwd=code, env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
        )  # fmt: skip
        harness.LIVE.add(self.workers)

    def wait_ready(self) -> None:
        deadline = time.monotonic() + READY_LIMIT_S
        body = json.dumps({"model": MODEL, "input": sentences(4)}).encode()
        while time.monotonic() < deadline:
            assert self.process is not None
            if self.process.poll() is not None:
                raise RuntimeError(
                    f"{self.name} exited:\n{harness.tail(os.path.join(self.folder, self.name + '.log'))}"
                )
            request = urllib.request.Request(self.url, body, {"Content-Type": "application/json"})
            try:
                with urllib.request.urlopen(request, timeout=60) as response:
                    if response.status == 200 and len(json.loads(response.read())["data"]) == 4:
                        return
            except OSError:
                time.sleep(0.5)
        raise RuntimeError(f"{self.name}: not ready within {READY_LIMIT_S:.0f} s")

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}{self.path}"

    def ticks(self) -> int:
        assert self.process is not None
        ticks = sum(harness.cpu_ticks_by_depth(self.process.pid))
        for other in (self.workers, self.redis.proc if self.redis is not None else None):
            if other is not None:
                ticks += sum(harness.cpu_ticks_by_depth(other.pid))
        return ticks

    def stop(self) -> None:
        if self.process is not None:
            try:
                os.killpg(self.process.pid, signal.SIGTERM)
                self.process.wait(15)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                pass
            harness.kill(self.process)
        if self.workers is not None:
            harness.kill(self.workers)
        if self.redis is not None:
            self.redis.stop()


class LargeClient(threading.Thread):
    """Sends requests of ``n`` inputs one after another until stopped; keeps
    the seconds each took and counts the ones that failed."""

    def __init__(self, url: str, n: int) -> None:
        super().__init__(daemon=True)
        self.url, self.n = url, n
        self.body = json.dumps({"model": MODEL, "input": sentences(n), "encoding_format": "float"}).encode()
        self.stopping = threading.Event()
        self.seconds: List[float] = []
        self.errors = 0
        self.started_at = self.stopped_at = 0.0

    def run(self) -> None:
        self.started_at = time.monotonic()
        while not self.stopping.is_set():
            request = urllib.request.Request(self.url, self.body, {"Content-Type": "application/json"})
            began = time.monotonic()
            try:
                with urllib.request.urlopen(request, timeout=120) as response:
                    ok = len(json.loads(response.read())["data"]) == self.n
            except OSError:
                ok = False
            if ok:
                self.seconds.append(time.monotonic() - began)
            else:
                self.errors += 1
        self.stopped_at = time.monotonic()

    def stop(self) -> Run:
        self.stopping.set()
        self.join()
        done = sorted(self.seconds)
        run = Run("ours, beside", self.n, errors=self.errors)
        run.inputs_per_s = len(done) * self.n / max(1e-9, self.stopped_at - self.started_at)
        run.p50_ms = (harness.percentile(done, 50) or 0.0) * 1000
        run.p99_ms = (harness.percentile(done, 99) or 0.0) * 1000
        return run


def measure(server: Server, per_request: int, args: argparse.Namespace) -> List[Run]:
    """One run of wrk at ``per_request`` inputs a request (and, with
    ``--beside-large``, the run of the large requests sent beside it)."""
    body = json.dumps({"model": MODEL, "input": sentences(per_request), "encoding_format": "float"})
    connections = max(1, args.inputs_in_flight // per_request)
    large = LargeClient(server.url, args.beside_large) if args.beside_large else None
    try:
        if large is not None:
            large.start()
        harness.run_wrk(server.url, connections, args.warmup, 60, body)
        before = server.ticks()
        summary, _ = harness.run_wrk(server.url, connections, args.duration, 60, body)
        after = server.ticks()
    except Exception as exc:
        return [Run(server.name, per_request, failure=f"{type(exc).__name__}: {exc}"[:500])]
    finally:
        beside = large.stop() if large is not None else None
    requests = max(1, summary["requests"])
    inputs = requests * per_request
    run = Run(server.name, per_request, inputs_per_s=inputs / (summary["duration_us"] / 1e6))
    run.p50_ms, run.p99_ms = summary["lat_p50_us"] / 1000, summary["lat_p99_us"] / 1000
    run.errors = sum(summary[kind] for kind in ("connect", "read", "write", "status", "timeout"))
    run.cpu_ms_per_input = (after - before) / harness.CLOCK_TICKS * 1000 / inputs
    return [run] if beside is None else [run, beside]


def median_runs(runs: List[Run]) -> List[Run]:
    """One run per server and inputs per request, in the order first met:
    the one of median inputs/s among the rounds that did not fail (the
    lower middle of an even count), carrying every round's rate; a failure
    where every round failed."""
    groups: Dict[Tuple[str, int], List[Run]] = {}
    for run in runs:
        groups.setdefault((run.server, run.per_request), []).append(run)
    chosen: List[Run] = []
    for group in groups.values():
        good = sorted((run for run in group if not run.failure), key=lambda run: run.inputs_per_s)
        if not good:
            chosen.append(group[-1])
            continue
        middle = good[(len(good) - 1) // 2]
        middle.rounds = [run.inputs_per_s for run in good]
        chosen.append(middle)
    return chosen


def report(runs: List[Run], args: argparse.Namespace) -> str:
    settings = ", ".join(args.setting) or "the example's"
    rounds = f"; median of {args.repeat} interleaved rounds (inputs/s of all in brackets)" if args.repeat > 1 else ""
    if args.beside_large:
        rounds += (
            f"; requests of {args.beside_large} inputs sent beside, one at a time (warm-up included; the server's "
            "CPU, theirs too, is counted over wrk's inputs)"
        )
    if args.code:
        rounds += f"; the code of {args.code}"
    lines = [
        f"forward pass {'stubbed' if args.stub_forward else 'real'}, {args.inputs_in_flight} inputs in flight, "
        f"{args.web_workers} web process(es) under {args.server}, backend {args.backend}, settings: {settings}"
        + rounds,
        "",
        "| server | inputs/request | connections | inputs/s | p50 ms | p99 ms | errors | server CPU ms/input |",
        "| --- | --: | --: | --: | --: | --: | --: | --: |",
    ]
    for run in runs:
        if run.failure:
            lines.append(f"| {run.server} | {run.per_request} | | FAILED: {run.failure} | | | | |")
            continue
        connections = 1 if run.server.endswith("beside") else max(1, args.inputs_in_flight // run.per_request)
        lines.append(
            f"| {run.server} | {run.per_request} | {connections} | "
            f"{run.inputs_per_s:,.0f}{_spread(run)} | {run.p50_ms:.1f} | {run.p99_ms:.1f} | {run.errors} | "
            + ("|" if run.server.endswith("beside") else f"{run.cpu_ms_per_input:.3f} |")
        )
    ours = {run.per_request: run for run in runs if run.server == "ours" and not run.failure}
    theirs = {run.per_request: run for run in runs if run.server == "infinity" and not run.failure}
    lines += ["", "| floor (issue #40) | measured | verdict |", "| --- | --: | --- |"]
    if 1 in ours and 32 in ours and not args.stub_forward:
        ratio = ours[32].inputs_per_s / ours[1].inputs_per_s
        lines.append(
            f"| inputs/s at 32 a request >= {FLOOR_VS_ONE}x at 1 | {ratio:.2f}x | {_verdict(ratio >= FLOOR_VS_ONE)} |"
        )
    if 32 in ours and args.stub_forward:
        cpu = ours[32].cpu_ms_per_input
        lines.append(
            f"| server CPU per input at 32 a request <= {FLOOR_CPU_MS} ms | {cpu:.3f} ms | "
            f"{_verdict(cpu <= FLOOR_CPU_MS)} |"
        )
    if 32 in ours and 32 in theirs and not args.stub_forward:
        ratio = ours[32].inputs_per_s / theirs[32].inputs_per_s
        lines.append(
            f"| at 32 a request >= {FLOOR_VS_INFINITY}x infinity-emb | {ratio:.2f}x | "
            f"{_verdict(ratio >= FLOOR_VS_INFINITY)} |"
        )
    return "\n".join(lines)


def _spread(run: Run) -> str:
    if len(run.rounds) < 2:
        return ""
    return f" ({min(run.rounds):,.0f}-{max(run.rounds):,.0f})"


def _verdict(ok: bool) -> str:
    return "PASS" if ok else "MISS"


def parse_args(argv: Optional[Sequence[str]]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.many_bench", description=__doc__.split("\n\n")[0])
    parser.add_argument("--per-request", default="1,8,32,128", help="inputs per request, comma-separated")
    parser.add_argument("--inputs-in-flight", type=int, default=128, help="inputs wrk keeps in flight (default 128)")
    parser.add_argument("--web-workers", type=int, default=1, help="gunicorn processes of the example (default 1)")
    parser.add_argument(
        "--backend",
        default="thread",
        choices=("thread", "process", "redis"),
        help="the example's backend (redis: a redis-server of the run's own and one worker process)",
    )
    parser.add_argument(
        "--server",
        default="gunicorn",
        choices=("gunicorn", "granian"),
        help="the example's server: gunicorn with its gunicorn.conf.py (default), or granian on its WSGI module",
    )
    parser.add_argument("--stub-forward", action="store_true", help="the model's forward pass answers at once")
    parser.add_argument(
        "--setting",
        action="append",
        default=[],
        metavar="STREAMER_X=VALUE",
        help="a setting of the example's, as FLASK_STREAMER_X (repeatable), e.g. STREAMER_MAX_BATCH_COST=2048",
    )
    parser.add_argument("--infinity", metavar="VENV", help="a virtual environment with infinity-emb: run it beside")
    parser.add_argument(
        "--infinity-dtype",
        default="auto",
        choices=("auto", "float32", "bfloat16"),
        help="infinity-emb's --dtype (default auto: float32 on a CPU); the example's is EMBEDDING_PRECISION",
    )
    parser.add_argument(
        "--beside-large", type=int, default=0, metavar="N", help="send requests of N inputs beside wrk's, one at a time"
    )
    parser.add_argument("--code", metavar="PATH", help="the checkout whose library and example the server runs")
    parser.add_argument("--duration", type=float, default=8.0, help="measured seconds per run (default 8)")
    parser.add_argument("--warmup", type=float, default=4.0, help="seconds of load before each run (default 4)")
    parser.add_argument(
        "--repeat", type=int, default=1, help="rounds, each server started afresh in turn; the median shown (default 1)"
    )
    args = parser.parse_args(argv)
    if args.repeat < 1:
        parser.error("--repeat must be at least 1")
    return args


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    if shutil.which("wrk") is None:
        print("many_bench needs wrk: apt-get install -y wrk", file=sys.stderr)
        return 2
    per_request = [int(n) for n in args.per_request.split(",")]
    names = ["ours"] + (["infinity"] if args.infinity else [])
    runs: List[Run] = []
    with tempfile.TemporaryDirectory(prefix="many-bench-") as folder:
        for round_ in range(1, args.repeat + 1):
            for name in names:
                server = Server(name, args, folder)
                try:
                    server.start()
                    server.wait_ready()
                    for n in per_request:
                        measured = measure(server, n, args)
                        runs.extend(measured)
                        run = measured[0]
                        said = (
                            f"round {round_}: {name} {n}/request: {run.inputs_per_s:,.0f} inputs/s, "
                            f"{run.cpu_ms_per_input:.3f} ms CPU/input"
                        )
                        print(said + (f" ({run.failure})" if run.failure else ""), flush=True)
                except Exception as exc:
                    runs.extend(Run(name, n, failure=f"{type(exc).__name__}: {exc}"[:500]) for n in per_request)
                finally:
                    server.stop()
    print(report(median_runs(runs), args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
