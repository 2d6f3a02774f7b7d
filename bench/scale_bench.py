"""The whole deployment on one box, as users deploy it, and the CPU a
request costs in each of its processes.

    apt-get install -y wrk
    .venv/bin/pip install -e '.[example,bench]'
    .venv/bin/python -m bench.scale_bench                        # every deployment, 1 run: 4-5 minutes on 2 cores
    .venv/bin/python -m bench.scale_bench --stub-forward --repeat 3 --variants ours-thread,ours-redis
    .venv/bin/python -m bench.scale_bench --web-workers 8 --model-workers 1 --devices 0   # a 16-core GPU box
    .venv/bin/python -m bench.scale_bench --stub-forward --connections 8,32,128 --plots bench/plots

Each deployment serves the examples' sentence model (all-MiniLM-L6-v2)
under gunicorn, ``--web-workers`` processes (default: half the cores),
gevent_pywsgi workers as the examples' ``gunicorn.conf.py`` sets (service_streamer's
views: ``gthread``, threads enough for every connection), and wrk sends
``{"s": "<a 15-word sentence>"}`` from ``--connections`` connections for
``--duration`` seconds after ``--warmup``; the deployments run one after another, ``--repeat`` times,
interleaved:

======================  ==========================================================
``ours-thread``         example_flask, the thread backend (a model per web process, two batches at once)
``ours-thread-1batch``  the same, one batch at a time (``STREAMER_MODEL_THREADS=1``; named with ``--variants`` only)
``ours-thread-traced``  the same, tracing on, OpenTelemetry's SDK in each process (named with ``--variants`` only)
``ours-thread-gevent``  the same under gunicorn's ``-k gevent`` worker (named with ``--variants`` only)
``ours-process``        example_flask, the process backend (``--model-workers`` spawned per web process)
``ours-redis``          example_flask on Redis, ``--model-workers`` workers of ``flask streamer run-workers``
``ss-thread``           service_streamer's ThreadedStreamer in a plain Flask view
``ss-process``          service_streamer's Streamer (spawned workers) in that view
``ss-redis``            service_streamer's RedisStreamer in that view, its own Redis workers
``naive``               example_flask's ``/naive``: the model called once per request
``django-thread``       example_django, the thread backend, gunicorn (named with ``--variants`` only)
``django-asgi``         example_django, the thread backend, uvicorn, async views (``/astream``)
``mosec``               mosec 0.9.8: one Worker process seeing whole batches (``bench/peers/mosec_server.py``)
``litserve``            LitServe 0.2.19: a LitAPI with batching (``bench/peers/litserve_server.py``)
``infinity``            infinity-emb 0.0.78: ``infinity_emb v2``, the torch engine on the CPU (real model only)
======================  ==========================================================

Each ``ours-*`` deployment and ``django-thread`` also runs under granian (a
Rust HTTP server, ``--interface wsgi``, ``--threads`` blocking threads per
process) instead of gunicorn when named with ``-granian``:
``ours-thread-granian``, ``ours-redis-granian``, ``django-thread-granian``.

``--precision`` gives every server the same precision: ``float32`` or
``bfloat16`` (the examples' ``EMBEDDING_PRECISION``; mosec's and LitServe's
forward pass under torch's autocast, as the examples'; infinity's
``--dtype``, which casts its whole model). Left at ``defaults``, each runs
as it ships: the examples ``auto`` (bfloat16 on a CPU with AMX or AVX512-BF16), the others
float32 on a CPU.

The last three, the peers (``--variants peers`` names them all), run only
when named, each from a virtual environment of its own that
:mod:`bench.peer_venvs` makes on first use under ``--venvs`` (default
``bench/.venvs``, git-ignored): pinned versions, torch 2.13.0. Each is one
server process tree, serving the same model directory, batches of up to 64
formed within 10 ms as their docs advise (infinity: ``--batch-size 64``, its
own timing); its whole tree's CPU is counted under ``web``. mosec runs
``--model-workers`` model processes, as ``ours-process`` and ``ours-redis`` do.
``--stub-forward`` reaches mosec's and LitServe's model (they load it with
sentence-transformers, as the examples do), not infinity's engine: with it,
infinity is left out.

``--images`` uploads a JPEG of a cat (451 x 300, 35 KB, as ``curl -F
"file=@cat.jpg"`` sends it) to the examples' ``/classify`` instead, and to
service_streamer's tutorial view of the same model for ``ss-thread``.

For each: requests/s, p50 and p99, and the CPU each request cost, in ms, by
where it was spent, from /proc: the web processes, the model workers (the
process backend's spawned ones, or the Redis workers), redis-server, and
wrk. ``--stub-forward`` replaces the transformer's forward pass by one that
answers right-shaped outputs at once (the tokenizer and everything around
the model still run): what a request costs outside the model, on any
machine, which is what a GPU box is bound by. The floors of issue #29 are
printed, PASS or MISS, never asserted.

``--connections`` takes one count or several (``8,32,128``): each
deployment, once started, is measured at each in turn, a table row each.
Beside the table, :mod:`bench.plots` draws the same runs as PNG files in
``--plots`` (default ``bench/results/plots``, git-ignored; ``--plots ''``
draws none): requests/s against connections per deployment (with two counts
or more), the latency percentiles of each, and the CPU per request by
process role, both at the most connections.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple

from bench import harness, peer_venvs, plots, web_bench
from bench.apps.http_app import SENTENCE

#: The deployments with ``--images``: the examples' /classify, and
#: service_streamer's tutorial view of the same model.
IMAGE_VARIANTS = ("ours-thread", "ours-process", "ours-redis", "ss-thread")
#: Issue #29's floor for one H100 and 16 cores, the real model, Redis backend.
GPU_BOX_RPS = 6000
GPU_BOX_P99_MS = 150.0
#: Issue #30's floors: /classify on the same box, eight web processes, and
#: the web process's CPU per upload anywhere.
GPU_BOX_IMAGES_PER_S = 2500
IMAGE_WEB_FLOOR_MS = 1.0
VARIANTS = ("ours-thread", "ours-process", "ours-redis", "ss-thread", "ss-process", "ss-redis", "naive")
#: Not run unless named: the Django example on the thread backend, under
#: gunicorn (/stream) and under uvicorn (async views, /astream).
DJANGO_VARIANTS = ("django-thread", "django-asgi")
#: Not run unless named (``peers`` names all three): other serving
#: frameworks on the same model and load, each from a venv of its own.
PEER_VARIANTS = ("mosec", "litserve", "infinity")
#: Not run unless named: the Flask example on the thread backend running one
#: batch at a time (``STREAMER_MODEL_THREADS=1``), beside its default of two.
ONE_BATCH_VARIANTS = ("ours-thread-1batch",)
#: Not run unless named: the Flask example under gunicorn's ``gevent`` worker
#: (gunicorn's HTTP parser), which the examples used before ``gevent_pywsgi``.
GEVENT_VARIANTS = ("ours-thread-gevent",)
#: Not run unless named: the Flask example on the thread backend with tracing
#: on, every process with OpenTelemetry's SDK set up (``--trace-sample``
#: of the traces recorded; ``bench/apps/traced_gunicorn.py``): what tracing
#: costs a deployed request, beside ``ours-thread``.
TRACED_VARIANTS = ("ours-thread-traced",)
#: The deployments that run under granian instead of gunicorn when named with this suffix.
GRANIAN = "-granian"
GRANIAN_VARIANTS = ("ours-thread", "ours-process", "ours-redis", "django-thread")
#: The model, as the examples name it (resolved to the packaged copy's folder).
MODEL = "all-MiniLM-L6-v2"
#: infinity's OpenAI-style body: the same sentence, one input a request.
INFINITY_BODY = json.dumps({"model": MODEL, "input": [SENTENCE]})
ROLES = ("web", "workers", "redis", "wrk")
STUB_PATH = os.path.join(harness.REPO_ROOT, "bench", "apps", "stub_forward")
READY_LIMIT_S = 300.0  # a model per process, loaded on a busy machine
BODY = json.dumps({"s": SENTENCE})
# The floors of issue #29: CPU ms per request outside the forward pass (web +
# workers + Redis, wrk excluded), measured with --stub-forward.
FLOORS_MS = {"ours-redis": 1.0, "ours-thread": 0.8}
#: The latency percentiles wrk reports (bench/http_post.lua); 100: the slowest.
PERCENTILES = {50.0: "lat_p50_us", 75.0: "lat_p75_us", 90.0: "lat_p90_us", 95.0: "lat_p95_us",
               99.0: "lat_p99_us", 99.9: "lat_p99.9_us", 100.0: "lat_max_us"}  # fmt: skip
#: Where the figures go unless --plots says otherwise (git-ignored).
DEFAULT_PLOTS = os.path.join("bench", "results", "plots")


@dataclass
class Result:
    """One measured run of one deployment."""

    variant: str
    connections: int = 0
    rps: float = 0.0
    p50_ms: Optional[float] = None
    p99_ms: Optional[float] = None
    errors: int = 0
    cpu_ms: Dict[str, float] = field(default_factory=dict)  # by role, per request
    latency_ms: Dict[float, float] = field(default_factory=dict)  # by percentile (100: the slowest)
    failure: Optional[str] = None

    @property
    def server_cpu_ms(self) -> float:
        """The deployment's own CPU per request: everything but wrk."""
        return sum(ms for role, ms in self.cpu_ms.items() if role != "wrk")


class Deployment:
    """One variant's processes: redis-server, workers, gunicorn, each in a
    process group of its own, all killed on the way out."""

    def __init__(self, variant: str, args: argparse.Namespace, folder: str) -> None:
        self.variant = variant
        self.args = args
        self.folder = folder
        self.port = harness.free_port()
        self.redis: Optional[harness.PrivateRedis] = None
        self.workers: Optional[subprocess.Popen] = None
        self.web: Optional[subprocess.Popen] = None
        self.route = {
            "naive": "/naive", "django-asgi": "/astream", "mosec": "/inference", "litserve": "/predict",
            "infinity": "/embeddings",
        }.get(variant, "/stream")  # fmt: skip
        self.body = INFINITY_BODY if variant == "infinity" else BODY
        if args.images:
            self.route = "/classify"
        self.upload = web_bench.upload_body(folder) if args.images else None

    def env(self, **extra: str) -> Dict[str, str]:
        env = {key: value for key, value in os.environ.items() if not key.startswith(("FLASK_", "BENCH_WEB_"))}
        paths = [harness.REPO_ROOT] + ([STUB_PATH] if self.args.stub_forward else [])
        env["PYTHONPATH"] = os.pathsep.join(paths + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
        env.update(PYTHONUNBUFFERED="1", TOKENIZERS_PARALLELISM="false", **extra)
        if self.args.stub_forward:
            # The forward pass computes nothing on this CPU, as on a GPU box,
            # where the examples pin each web process to a core: the same here.
            env.setdefault("PIN_WORKERS", "1")
        return env

    def start(self) -> None:
        args = self.args
        variant, granian = self.variant.removesuffix(GRANIAN), self.variant.endswith(GRANIAN)
        prefix = f"scale-{variant}"
        env: Dict[str, str] = {}
        if variant.endswith("redis"):
            self.redis = harness.PrivateRedis(shutil.which("redis-server") or "redis-server", self.folder)
            self.redis.start()
        if variant in PEER_VARIANTS:
            command, env = self.peer_command()
            env.update(
                HF_HUB_OFFLINE="1", INFINITY_ANONYMOUS_USAGE_STATS="0", BENCH_PEER_WORKERS=str(args.model_workers)
            )
            if args.precision != "defaults":
                env["BENCH_PEER_PRECISION"] = args.precision
            self.web = self._group(command, env, "web")
            return
        if args.precision != "defaults":
            env.update(FLASK_EMBEDDING_PRECISION=args.precision, EMBEDDING_PRECISION=args.precision)
        if variant.startswith("django"):
            env.update(STREAMER_BACKEND="thread", DJANGO_SETTINGS_MODULE="example_django.settings")
            if variant == "django-asgi":
                self.web = self._group(
                    [sys.executable, "-m", "uvicorn", "example_django.asgi:application", "--workers",
                     str(args.web_workers), "--port", str(self.port), "--log-level", "warning", "--no-access-log"],
                    env, "web",
                )  # fmt: skip
                return
            app = ["-c", "example_django/gunicorn.conf.py", "example_django.wsgi"]
            module = "example_django.wsgi:application"
        elif variant.startswith("ours") or variant == "naive":
            backend = variant.split("-")[1] if variant != "naive" else "thread"
            env.update(FLASK_STREAMER_BACKEND=backend, FLASK_STREAMER_WORKER_NUM=str(args.model_workers))
            if variant in ONE_BATCH_VARIANTS:
                env["FLASK_STREAMER_MODEL_THREADS"] = "1"
            if variant in TRACED_VARIANTS:
                env.update(FLASK_STREAMER_TRACING="true", BENCH_TRACE_SAMPLE=str(args.trace_sample))
            if args.devices:
                env["FLASK_STREAMER_CUDA_DEVICES"] = json.dumps(args.devices)
            if self.redis is not None:
                env.update(
                    FLASK_STREAMER_REDIS_URL=f"redis://127.0.0.1:{self.redis.port}/0", FLASK_STREAMER_PREFIX=prefix
                )
                command = [sys.executable, "-m", "flask", "--app", "example_flask", "streamer", "run-workers"]
                command += ["--workers", str(args.model_workers), "--log-level", "WARNING"]
                if args.devices:
                    command += ["--devices", args.devices]
                self.workers = self._group(command, env, "workers")
            conf = "bench/apps/traced_gunicorn.py" if variant in TRACED_VARIANTS else "example_flask/gunicorn.conf.py"
            app = ["-c", conf, "example_flask:create_app()"]
            module = "example_flask.wsgi:app"
        else:
            env.update(BENCH_WEB_KIND=variant.split("-")[1], BENCH_WEB_WORKERS=str(args.model_workers))
            env["BENCH_WEB_DEVICES"] = args.devices or ""
            if self.redis is not None:
                broker = f"127.0.0.1:{self.redis.port}"  # service_streamer takes host:port
                env.update(BENCH_WEB_REDIS=broker, BENCH_WEB_PREFIX=prefix)
                command = [sys.executable, "-m", "bench.apps.ss_workers", broker, prefix, str(args.model_workers)]
                self.workers = self._group(command + [args.devices or ""], env, "workers")
            app = ["bench.apps.web_apps:flask_classify_app()" if args.images else "bench.apps.web_apps:flask_app()"]
        if granian:
            threads = args.threads or math.ceil(max(args.connections) / args.web_workers) + 8
            command = [sys.executable, "-m", "granian", "--interface", "wsgi", "--host", "127.0.0.1", "--port",
                       str(self.port), "--workers", str(args.web_workers), "--blocking-threads", str(threads),
                       "--runtime-threads", "1", "--no-ws", "--log-level", "warning", module]  # fmt: skip
            self.web = self._group(command, env, "web")
            return
        worker_class = self.worker_class()
        gunicorn = [sys.executable, "-m", "gunicorn", "-w", str(args.web_workers), "-k", worker_class]
        if worker_class == "gthread":
            gunicorn += ["--threads", str(args.threads or math.ceil(max(args.connections) / args.web_workers) + 8)]
        gunicorn += ["-b", f"127.0.0.1:{self.port}", "--timeout", "600"]
        gunicorn += ["--log-level", "warning", *app]
        self.web = self._group(gunicorn, env, "web")

    def peer_command(self) -> Tuple[List[str], Dict[str, str]]:
        """The command line of a peer's server, from its venv, and what it
        needs in its environment."""
        from example_models.embedding import resolve_model

        model, venv = resolve_model(MODEL), self.args.peer_venvs[self.variant]
        python = peer_venvs.python_of(venv)
        if self.variant == "mosec":
            script = os.path.join(harness.REPO_ROOT, "bench", "peers", "mosec_server.py")
            # mosec reads its own command line: the model comes in the environment.
            return [python, script, "--port", str(self.port), "--address", "127.0.0.1"], {"BENCH_PEER_MODEL": model}
        if self.variant == "litserve":
            script = os.path.join(harness.REPO_ROOT, "bench", "peers", "litserve_server.py")
            return [python, script, "--model", model, "--port", str(self.port)], {}
        command = [os.path.join(venv, "bin", "infinity_emb"), "v2", "--model-id", model, "--served-model-name", MODEL,
                "--host", "127.0.0.1", "--port", str(self.port), "--engine", "torch", "--device", "cpu",
                "--batch-size", "64", "--no-bettertransformer", "--no-vector-disk-cache",
                "--dtype", "auto" if self.args.precision == "defaults" else self.args.precision]  # fmt: skip
        return command, {}

    def worker_class(self) -> str:
        """gunicorn's worker class for this deployment: service_streamer's
        plain views under ``--ss-worker-class``, the rest under
        ``--worker-class``."""
        if self.variant in GEVENT_VARIANTS:
            return "gevent"
        return self.args.ss_worker_class if self.variant.startswith("ss-") else self.args.worker_class

    def _group(self, command: List[str], env: Dict[str, str], name: str) -> subprocess.Popen:
        log = open(os.path.join(self.folder, f"{self.variant}-{name}.log"), "w")  # noqa: SIM115 - closed with the process
        process = subprocess.Popen(
            command, cwd=harness.REPO_ROOT, env=self.env(**env), stdout=log, stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL, start_new_session=True,
        )  # fmt: skip
        harness.LIVE.add(process)
        return process

    def wait_ready(self) -> None:
        """Until the route answers 200 from every web process, about: a
        burst of requests all answered (each process loads its model)."""
        deadline = time.monotonic() + READY_LIMIT_S
        url = f"http://127.0.0.1:{self.port}{self.route}"
        ok = 0
        while time.monotonic() < deadline:
            for process in (self.web, self.workers):
                if process is not None and process.poll() is not None:
                    raise RuntimeError(f"{self.variant}: a process exited:\n{self.log_tail()}")
            try:
                request = self.request(url)
                with urllib.request.urlopen(request, timeout=60) as response:
                    ok = ok + 1 if response.status == 200 else 0
            except urllib.error.HTTPError as exc:
                if 400 <= exc.code < 500:  # the request itself is refused: waiting will not help
                    raise RuntimeError(f"{self.variant}: {url} answers {exc.code}: {exc.read()[:300]!r}") from exc
                ok = 0
                time.sleep(0.5)
            except OSError:
                ok = 0
                time.sleep(0.5)
            if ok >= 4 * self.args.web_workers:
                return
        raise RuntimeError(f"{self.variant}: not ready within {READY_LIMIT_S:.0f} s:\n{self.log_tail()}")

    def request(self, url: str) -> urllib.request.Request:
        """One request of this deployment's load: the sentence, or the upload."""
        if self.upload is None:
            return urllib.request.Request(url, self.body.encode(), {"Content-Type": "application/json"})
        path, content_type = self.upload
        with open(path, "rb") as handle:
            return urllib.request.Request(url, handle.read(), {"Content-Type": content_type})

    def ticks(self) -> Dict[str, int]:
        """CPU clock ticks so far, by role."""
        assert self.web is not None
        master, web, spawned = harness.cpu_ticks_by_depth(self.web.pid)
        ticks = {"web": master + web, "workers": spawned, "redis": 0}
        if self.workers is not None:
            ticks["workers"] += harness.cpu_ticks(self.workers.pid)
        if self.redis is not None and self.redis.proc is not None:
            ticks["redis"] = harness.cpu_ticks(self.redis.proc.pid)
        return ticks

    def log_tail(self) -> str:
        parts = []
        for name in ("web", "workers"):
            path = os.path.join(self.folder, f"{self.variant}-{name}.log")
            if os.path.exists(path):
                parts.append(f"--- {name} ---\n{harness.tail(path, 1500)}")
        return "\n".join(parts)

    def stop(self) -> None:
        for process in (self.web, self.workers):
            if process is not None:
                try:
                    os.killpg(process.pid, signal.SIGTERM)
                    process.wait(15)
                except (ProcessLookupError, subprocess.TimeoutExpired):
                    pass
                harness.kill(process)
        if self.redis is not None:
            self.redis.stop()


def measure(variant: str, args: argparse.Namespace, folder: str) -> List[Result]:
    """Start ``variant`` once and measure it at each of ``--connections``
    (a warm-up before each): a result per count, or failed ones from the
    count that failed on."""
    deployment = Deployment(variant, args, folder)
    results: List[Result] = []
    try:
        deployment.start()
        deployment.wait_ready()
        url = f"http://127.0.0.1:{deployment.port}{deployment.route}"
        for connections in args.connections:
            body, upload = deployment.body, deployment.upload
            harness.run_wrk(url, connections, args.warmup, 30, body, upload)
            before = deployment.ticks()
            summary, wrk_cpu_s = harness.run_wrk(url, connections, args.duration, 30, body, upload)
            after = deployment.ticks()
            results.append(_result(variant, connections, summary, wrk_cpu_s, before, after))
    except Exception as exc:
        failure = f"{type(exc).__name__}: {exc}"[:2000]
        results += [Result(variant, c, failure=failure) for c in args.connections[len(results) :]]
    finally:
        deployment.stop()
    return results


def _result(
    variant: str, connections: int, summary: Dict[str, Any], wrk_cpu_s: float, before: Dict[str, int],
    after: Dict[str, int],
) -> Result:  # fmt: skip
    """One run's row, from wrk's summary and the CPU ticks around it."""
    requests = max(1, summary["requests"])
    result = Result(variant, connections, rps=summary["requests"] / (summary["duration_us"] / 1e6))
    result.p50_ms, result.p99_ms = summary["lat_p50_us"] / 1000, summary["lat_p99_us"] / 1000
    result.latency_ms = {rank: summary[key] / 1000 for rank, key in PERCENTILES.items() if key in summary}
    result.errors = sum(summary[kind] for kind in ("connect", "read", "write", "status", "timeout"))
    result.cpu_ms = {role: (after[role] - before[role]) / harness.CLOCK_TICKS * 1000 / requests for role in after}
    result.cpu_ms["wrk"] = wrk_cpu_s * 1000 / requests
    return result


def at_connections(runs: List[Result], connections: int) -> List[Result]:
    """The runs measured at ``connections``."""
    return [run for run in runs if run.connections == connections]


def plot_points(results: Dict[str, List[Result]]) -> List[plots.Point]:
    """Each deployment's median run at each connection count, for the figures."""
    points = []
    for variant, runs in results.items():
        for connections in sorted({run.connections for run in runs}):
            run = median_result(at_connections(runs, connections))
            if run.failure is None:
                points.append(plots.Point(variant, connections, run.rps, dict(run.latency_ms), dict(run.cpu_ms)))
    return points


def median_result(runs: List[Result]) -> Result:
    ok = sorted((run for run in runs if run.failure is None), key=lambda run: run.rps)
    return ok[len(ok) // 2] if ok else runs[0]


def report(all_results: Dict[str, List[Result]], args: argparse.Namespace) -> str:
    """The markdown table (a row per deployment and connection count) and
    the floors, judged at the most connections."""
    most = max(args.connections)
    results = {variant: at_connections(runs, most) for variant, runs in all_results.items()}
    lines = [
        f"scale_bench: {args.web_workers} web process(es) ({args.worker_class}; service_streamer's "
        f"{args.ss_worker_class}), {args.model_workers} model worker(s), "
        f"{','.join(map(str, args.connections))} connections, {args.duration:g} s runs, {args.repeat} repeat(s)"
        + (", forward pass stubbed" if args.stub_forward else "")
        + (f", devices {args.devices}" if args.devices else ""),
        "",
        "| deployment | req/s (range) | p50 ms | p99 ms | errors "
        "| CPU ms/req: web | workers | redis | wrk | server total |",
        "| --- | --: | --: | --: | --: | --: | --: | --: | --: | --: |",
    ]
    for variant, every in all_results.items():
        for connections in args.connections:
            runs = at_connections(every, connections)
            if not runs:
                continue
            name = variant if len(args.connections) == 1 else f"{variant}, {connections} conn."
            run = median_result(runs)
            if run.failure is not None:
                lines.append(f"| {name} | failed: {run.failure.splitlines()[0][:100]} | | | | | | | | |")
                continue
            rates = [r.rps for r in runs if r.failure is None]
            spread = f" ({min(rates):.0f}-{max(rates):.0f})" if len(rates) > 1 else ""
            cpu = [f"{run.cpu_ms.get(role, 0.0):.2f}" for role in ROLES]
            lines.append(
                f"| {name} | {run.rps:.0f}{spread} | {run.p50_ms:.1f} | {run.p99_ms:.1f} | {run.errors} | "
                + " | ".join(cpu)
                + f" | {run.server_cpu_ms:.2f} |"
            )
    lines += ratios(results)
    lines += ["", "| floor | measured | verdict |", "| --- | --: | --- |"]
    if args.images:
        return "\n".join(lines + image_floors(results, args))
    for variant, floor in FLOORS_MS.items():
        run = median_result(results[variant]) if variant in results else None
        if run is None or run.failure is not None or not args.stub_forward:
            why = "needs --stub-forward" if not args.stub_forward else "not run"
            lines.append(f"| {variant}: server CPU per request outside the forward pass <= {floor} ms | - | {why} |")
            continue
        verdict = "PASS" if run.server_cpu_ms <= floor else "MISS"
        lines.append(
            f"| {variant}: server CPU per request outside the forward pass <= {floor} ms "
            f"| {run.server_cpu_ms:.2f} ms | {verdict} |"
        )
    if "ours-redis" in results and args.devices and not args.stub_forward:
        run = median_result(results["ours-redis"])
        if run.failure is None:
            ok = run.rps >= GPU_BOX_RPS and run.p99_ms <= GPU_BOX_P99_MS
            lines.append(
                f"| ours-redis on the GPU box: >= {GPU_BOX_RPS:,} req/s at p99 <= {GPU_BOX_P99_MS:g} ms "
                f"(one H100, 16 cores) | {run.rps:,.0f} req/s, p99 {run.p99_ms:.0f} ms | {'PASS' if ok else 'MISS'} |"
            )
    best_ss = max((median_result(results[v]).rps for v in results if v.startswith("ss-")), default=0.0)
    if "ours-redis" in results and best_ss:
        ours = median_result(results["ours-redis"])
        ratio = ours.rps / best_ss
        lines.append(f"| ours-redis / service_streamer's best deployment (>= 2x on the GPU box) | {ratio:.2f}x | - |")
    return "\n".join(lines)


def ratios(results: Dict[str, List[Result]]) -> List[str]:
    """Each deployment's req/s and server CPU per request over mosec's and
    over ours (the first ``ours-*`` deployment run), at the most
    connections: rows, or none without either to divide by."""
    references = [name for name in ("mosec", next((v for v in results if v.startswith("ours-")), "")) if name]
    bases = {name: median_result(results[name]) for name in references if name in results}
    bases = {name: run for name, run in bases.items() if run.failure is None and run.rps and run.server_cpu_ms}
    if not bases:
        return []
    head = " | ".join(f"req/s ÷ {name} | CPU/req ÷ {name}" for name in bases)
    lines = ["", f"| deployment | {head} |", "| --- |" + " --: | --: |" * len(bases)]
    for variant, runs in results.items():
        run = median_result(runs)
        if run.failure is not None:
            continue
        cells = [f"{run.rps / b.rps:.2f}x | {run.server_cpu_ms / b.server_cpu_ms:.2f}x" for b in bases.values()]
        lines.append(f"| {variant} | " + " | ".join(cells) + " |")
    return lines


def image_floors(results: Dict[str, List[Result]], args: argparse.Namespace) -> List[str]:
    """Issue #30's floors, as rows: the web process's CPU per upload, and on
    the GPU box (``--devices``, the real model) images/s against the floor
    and against service_streamer's tutorial view in the same run."""
    lines = []
    for variant in ("ours-process", "ours-redis"):
        run = median_result(results[variant]) if variant in results else None
        if run is None or run.failure is not None:
            lines.append(f"| {variant}: web-process CPU per upload <= {IMAGE_WEB_FLOOR_MS} ms | - | not run |")
            continue
        verdict = "PASS" if run.cpu_ms.get("web", 0.0) <= IMAGE_WEB_FLOOR_MS else "MISS"
        lines.append(
            f"| {variant}: web-process CPU per upload <= {IMAGE_WEB_FLOOR_MS} ms "
            f"| {run.cpu_ms.get('web', 0.0):.2f} ms | {verdict} |"
        )
    ss = median_result(results["ss-thread"]) if "ss-thread" in results else None
    for variant in ("ours-thread", "ours-process", "ours-redis"):
        run = median_result(results[variant]) if variant in results else None
        if run is None or run.failure is not None:
            continue
        if args.devices and not args.stub_forward:
            ok = run.rps >= GPU_BOX_IMAGES_PER_S
            lines.append(
                f"| {variant} on the GPU box: >= {GPU_BOX_IMAGES_PER_S:,} images/s "
                f"({args.web_workers} web processes; the issue's is 8) | {run.rps:,.0f} | {'PASS' if ok else 'MISS'} |"
            )
        if ss is not None and ss.failure is None and ss.rps:
            ratio = run.rps / ss.rps
            verdict = ("PASS" if ratio >= 4 else "MISS") if args.devices and not args.stub_forward else "-"
            row = f"| {variant} / service_streamer's tutorial view (>= 4x on the GPU box) | {ratio:.2f}x | {verdict} |"
            lines.append(row)
    return lines


def parse_args(argv: Optional[Sequence[str]]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.scale_bench", description=__doc__.split("\n\n")[0])
    cores = os.cpu_count() or 2
    parser.add_argument(
        "--variants", default="", help=f"comma-separated, of {', '.join(VARIANTS)} (default: all; with --images, its)"
    )
    parser.add_argument(
        "--web-workers", type=int, default=max(1, cores // 2), help="gunicorn processes (half the cores)"
    )
    parser.add_argument("--model-workers", type=int, default=1, help="Redis workers; per web process for 'process'")
    parser.add_argument("--devices", default="", help="CUDA devices of the model workers, e.g. 0 or 0,1")
    parser.add_argument(
        "--threads", type=int, default=0, help="gthread threads per process (default: fit the connections)"
    )
    parser.add_argument(
        "--worker-class",
        default="gevent_pywsgi",
        choices=["gthread", "gevent", "gevent_pywsgi"],
        help="gunicorn's worker class for the examples (default gevent_pywsgi, as their gunicorn.conf.py)",
    )
    parser.add_argument(
        "--ss-worker-class",
        default="gthread",
        choices=["gthread", "gevent"],
        help="for service_streamer's views (default gthread: under gevent its model thread is a greenlet "
        "that holds the loop while the model runs)",
    )
    parser.add_argument(
        "--connections", default="128", help="wrk connections, one count or several: 8,32,128 (default 128)"
    )
    parser.add_argument("--duration", type=float, default=8.0, help="measured seconds per run (default 8)")
    parser.add_argument(
        "--warmup", type=float, default=4.0, help="seconds of load before each measured run (default 4)"
    )
    parser.add_argument("--repeat", type=int, default=1, help="runs of each deployment, interleaved (default 1)")
    parser.add_argument("--stub-forward", action="store_true", help="the model's forward pass answers at once")
    parser.add_argument(
        "--precision",
        default="defaults",
        choices=("defaults", "float32", "bfloat16"),
        help="every server's precision (default: each its own: the examples bfloat16 on a CPU with AMX or AVX512-BF16, "
        "the peers float32)",
    )
    parser.add_argument(
        "--images",
        action="store_true",
        help="upload a JPEG to /classify instead (variants ours-* and ss-thread, service_streamer's tutorial view)",
    )
    parser.add_argument(
        "--venvs",
        default=peer_venvs.DEFAULT_ROOT,
        help=f"where the peers' venvs are made on first use (default {peer_venvs.DEFAULT_ROOT})",
    )
    parser.add_argument(
        "--infinity", default="", metavar="VENV", help="a venv with infinity-emb made elsewhere: use it as it is"
    )
    parser.add_argument(
        "--trace-sample",
        type=float,
        default=1.0,
        help="ours-thread-traced: the share of traces recorded (default 1: every one; 0.01: one in a hundred)",
    )
    parser.add_argument("--json", default="", help="also write every run here")
    parser.add_argument(
        "--plots",
        default=DEFAULT_PLOTS,
        help=f"write the figures (PNG) in this folder (default {DEFAULT_PLOTS}; '' for none)",
    )
    args = parser.parse_args(argv)
    try:
        args.connections = [int(c) for c in str(args.connections).split(",") if c.strip()]
    except ValueError:
        parser.error(f"--connections takes counts separated by commas, not {args.connections!r}")
    if not args.connections or min(args.connections) < 1:
        parser.error("--connections needs at least one count of 1 or more")
    named = [v.strip() for v in args.variants.split(",") if v.strip()]
    args.variants = [p for v in named for p in (PEER_VARIANTS if v == "peers" else (v,))]
    if args.stub_forward and "infinity" in args.variants:
        print("scale_bench: --stub-forward does not reach infinity's engine: infinity left out", file=sys.stderr)
        args.variants.remove("infinity")
    if not args.variants:
        args.variants = list(IMAGE_VARIANTS if args.images else VARIANTS)
    unfit = [v for v in args.variants if v not in IMAGE_VARIANTS]
    if args.images and unfit:
        parser.error(f"--images serves {', '.join(IMAGE_VARIANTS)}; not {', '.join(unfit)}")
    known = (
        VARIANTS
        + DJANGO_VARIANTS
        + PEER_VARIANTS
        + ONE_BATCH_VARIANTS
        + GEVENT_VARIANTS
        + TRACED_VARIANTS
        + tuple(v + GRANIAN for v in GRANIAN_VARIANTS)
    )
    unknown = set(args.variants) - set(known)
    if unknown:
        parser.error(f"unknown variants {sorted(unknown)}; known: {', '.join(known)}; peers: mosec, litserve, infinity")
    args.peer_venvs = {}
    return args


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    if shutil.which("wrk") is None:
        print("scale_bench: wrk is not installed: apt-get install -y wrk", file=sys.stderr)
        return 2
    for variant in args.variants:
        if variant in PEER_VARIANTS:  # made before any run, so none is measured beside pip
            override = args.infinity if variant == "infinity" else None
            args.peer_venvs[variant] = peer_venvs.ensure(variant, args.venvs, override)
    # Killed (timeout(1), a CI limit): through the finally below, which
    # kills the servers; each leads a session of its own, and would outlive us.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    started = time.monotonic()
    results: Dict[str, List[Result]] = {variant: [] for variant in args.variants}
    try:
        with tempfile.TemporaryDirectory(prefix="scale-bench-") as folder:
            for round_ in range(args.repeat):
                for variant in args.variants:
                    for result in measure(variant, args, folder):
                        results[variant].append(result)
                        at = f"[{round_ + 1}/{args.repeat}] {variant}, {result.connections} conn."
                        if result.failure:
                            print(f"{at}: failed: {result.failure}", flush=True)
                        else:
                            cpu = ", ".join(f"{role} {ms:.2f}" for role, ms in result.cpu_ms.items())
                            print(
                                f"{at}: {result.rps:.0f} req/s, p50 {result.p50_ms:.1f} "
                                f"ms, p99 {result.p99_ms:.1f} ms, errors {result.errors}; CPU ms/req: {cpu}",
                                flush=True,
                            )
    finally:
        harness.kill_everything_left()
    print()
    print(report(results, args))
    print(f"\n(total {time.monotonic() - started:.0f} s)")
    if args.json:
        with open(args.json, "w") as handle:
            json.dump({v: [r.__dict__ for r in runs] for v, runs in results.items()}, handle, indent=2)
    if args.plots:
        subtitle = (
            f"{args.web_workers} web process(es), {'forward pass stubbed' if args.stub_forward else 'real model'}"
            + (", /classify uploads" if args.images else "")
        )
        name = "scale-images" if args.images else "scale"
        for path in plots.write_figures(plot_points(results), args.plots, name, subtitle):
            print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
