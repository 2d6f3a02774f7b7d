"""Closed-loop benchmark of the Redis backend: streamer_core next to service_streamer 0.1.2.

The same measurement as :mod:`bench.core_bench` (its machinery is reused:
clients, window, batch log, child interpreters, tables), with the model
behind Redis. For every (scenario, library) run, this process:

1. starts a private ``redis-server`` on a free port (no persistence, its own
   temporary directory), so runs share no keys, connections or buffers with
   each other, with the machine's shared Redis, or with anything else;
2. starts the library's workers in a process group of their own:
   ``run_redis_workers_forever(...)`` (``python -m bench.redis_bench
   --workers-process ...``), or for streamer_core with ``--launcher cli`` the
   ``streamer-worker`` command; and waits until each worker has loaded the
   simulated model (it leaves ``<pid>.ready`` in the batch-log directory);
3. runs the clients in a child interpreter (``python -m bench.redis_bench
   --child ...``) with ``RedisStreamer``; the child sends one request until
   it is answered before the warm-up and the measured window start;
4. stops the workers: streamer_core's get SIGTERM and should drain and
   return (how long they took is reported), service_streamer's never exit by
   themselves; then the whole worker group is killed either way, and
5. looks at what the run left in Redis, and shuts the server down.

Everything is bounded by time limits, and a try/finally (also on Ctrl-C and
SIGTERM) kills whatever is left, so no process survives a run.

Run from the repository root::

    .venv/bin/python -m bench.redis_bench                 # every Redis scenario, both libraries
    .venv/bin/python -m bench.redis_bench --only ours --launcher cli --scenarios 'redis1w-*'
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import replace
from typing import Any, Dict, List, Optional, Sequence

from bench import core_bench, harness
from bench.core_bench import (
    REPO_ROOT,
    RunResult,
    RunSpec,
    Scenario,
    Target,
)

SCENARIOS = (
    Scenario("redis1w-1c", "redis", clients=1, workers=1),
    Scenario("redis1w-64c", "redis", clients=64, workers=1),
    Scenario("redis1w-128c", "redis", clients=128, workers=1),
    Scenario("redis2w-256c", "redis", clients=256, workers=2),
    # Large inputs: each client sends a (3, 224, 224) float32 image (588 KB);
    # the device takes 5 ms + 1 ms per image, batches of 32.
    Scenario(
        "redis1w-64c-image",
        "redis",
        clients=64,
        workers=1,
        batch_size=32,
        fixed_ms=5.0,
        per_item_ms=1.0,
        payload="image",
    ),
)

# Throughput targets at two batches of callers per worker, as in core_bench
# (CORE_TARGETS says why).
REDIS_TARGETS: Sequence[Target] = (
    (
        "redis 1 worker, 128 clients: >= 0.90 of ideal",
        lambda m, lib: harness.verdict(m.of_ideal(lib, "redis1w-128c"), 0.90, True),
    ),
    (
        "redis: 2 workers, 256 clients >= 1.8x 1 worker, 128 clients",
        lambda m, lib: harness.verdict(m.scaling(lib, "redis1w-128c", "redis2w-256c"), 1.8, True),
    ),
    (
        "588 KB images, 1 worker, 64 clients: >= 0.85 of ideal",
        lambda m, lib: harness.verdict(m.of_ideal(lib, "redis1w-64c-image"), 0.85, True),
    ),
    (
        "588 KB images: >= 1.3x service_streamer in the same run",
        lambda m, lib: harness.verdict(m.versus(lib, "theirs", "redis1w-64c-image"), 1.3, True),
    ),
)

# Time limits, in seconds.
WORKERS_LOAD_LIMIT_S = 60.0  # spawned interpreters importing the libraries on a busy machine
WORKERS_STOP_LIMIT_S = 15.0  # streamer_core's workers, after SIGTERM, before the group is killed
WARM_UP_LIMIT_S = 30.0  # the child's first request, until it is answered
LEFTOVER_GRACE_S = 3.0  # for processes of streamer_core's worker group to exit after its supervisor returned


# -- processes --------------------------------------------------------------------------


class Workers:
    """One library's Redis workers, in a process group of their own."""

    def __init__(self, spec: RunSpec, launcher: str, log_path: str) -> None:
        self.spec = spec
        self.launcher = launcher
        self.log_path = log_path
        self.proc: Optional[subprocess.Popen] = None

    def command(self) -> List[str]:
        spec, cost, options = self.spec, self.spec.cost, self.spec.options
        if spec.library == "ours" and self.launcher == "cli":
            script = os.path.join(os.path.dirname(sys.executable), "streamer-worker")
            base = [script] if os.path.exists(script) else [sys.executable, "-m", "streamer_core.cli"]
            return base + [
                "bench.sim:SimModel",
                "--workers", str(spec.scenario.workers),
                "--batch-size", str(cost.batch_size),
                "--max-latency", str(cost.max_latency_s),
                "--redis", f"redis://{options['broker']}/0",
                "--prefix", options["prefix"],
                "--init-kwargs", json.dumps({"fixed_ms": cost.fixed_ms, "per_item_ms": cost.per_item_ms}),
            ]  # fmt: skip
        return [sys.executable, "-m", "bench.redis_bench", "--workers-process", spec.to_json()]

    def start(self) -> None:
        from bench import sim

        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [REPO_ROOT, env.get("PYTHONPATH")]))
        env[sim.BATCH_LOG_ENV] = self.spec.options["batch_log_dir"]
        env[sim.FIXED_MS_ENV] = repr(self.spec.cost.fixed_ms)  # service_streamer's workers read these
        env[sim.PER_ITEM_MS_ENV] = repr(self.spec.cost.per_item_ms)
        with open(self.log_path, "w") as log:
            self.proc = subprocess.Popen(
                self.command(), cwd=REPO_ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL, start_new_session=True,
            )  # fmt: skip
        harness.LIVE.add(self.proc)

    def wait_loaded(self) -> None:
        """Until every worker has loaded the model; raises past the limit or
        when the workers' launcher exits."""
        assert self.proc is not None
        directory = self.spec.options["batch_log_dir"]
        deadline = time.monotonic() + WORKERS_LOAD_LIMIT_S
        while True:
            ready = sum(name.endswith(".ready") for name in os.listdir(directory))
            if ready >= self.spec.scenario.workers:
                return
            if self.proc.poll() is not None:
                raise RuntimeError(f"the workers exited with code {self.proc.returncode} before loading the model")
            if time.monotonic() > deadline:
                raise RuntimeError(f"{ready} of {self.spec.scenario.workers} workers loaded the model in "
                                   f"{WORKERS_LOAD_LIMIT_S:.0f}s")  # fmt: skip
            time.sleep(0.05)

    def stop(self) -> Dict[str, Any]:
        """streamer_core: SIGTERM to the supervisor, which should let each
        worker finish its batch and return; service_streamer: nothing stops
        its workers. Then the group is killed either way. Returns how it went:
        ``how`` is "returned" (with ``seconds`` and ``code``), "hung" (did not
        return within the limit) or "killed" (no graceful stop offered), and
        ``left`` the processes still in the group when it was killed."""
        proc = self.proc
        assert proc is not None
        outcome: Dict[str, Any] = {"how": "killed", "left": 0}
        if self.spec.library == "ours" and proc.poll() is None:
            started = time.monotonic()
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(WORKERS_STOP_LIMIT_S)
                outcome = {"how": "returned", "seconds": time.monotonic() - started, "code": proc.returncode}
            except subprocess.TimeoutExpired:
                outcome = {"how": "hung", "seconds": WORKERS_STOP_LIMIT_S}
        elif proc.poll() is not None:
            outcome = {"how": "exited early", "code": proc.returncode}
        if self.spec.library == "ours" and outcome["how"] == "returned":
            # service_streamer's workers are always still there, by design. After
            # streamer_core's supervisor returned, multiprocessing's resource
            # tracker needs a moment to see its pipe close and exit.
            grace_until = time.monotonic() + LEFTOVER_GRACE_S
            while harness.group_members(proc.pid) and time.monotonic() < grace_until:
                time.sleep(0.05)
            left = harness.group_members(proc.pid)
            outcome["left"] = len(left)
            if left:
                outcome["left_commands"] = [harness.command_line(pid) for pid in left]
        harness.kill(proc)
        self.proc = None
        return outcome

    def kill(self) -> None:
        if self.proc is not None:
            harness.kill(self.proc)
            self.proc = None


def run_one(spec: RunSpec, redis_server: str, launcher: str) -> RunResult:
    """One (scenario, library) run: a private server, the workers, the
    clients in a child; everything stopped afterwards."""
    tmp = tempfile.mkdtemp(prefix="bench-redis-")
    server: Optional[harness.PrivateRedis] = None
    workers: Optional[Workers] = None
    try:
        server = harness.PrivateRedis(redis_server, tmp)
        server.start()
        log_dir = os.path.join(tmp, "batches")
        os.mkdir(log_dir)
        prefix = f"bench-{uuid.uuid4().hex[:8]}"
        options = {"broker": f"127.0.0.1:{server.port}", "prefix": prefix, "batch_log_dir": log_dir}
        spec = replace(spec, options=options)
        workers = Workers(spec, launcher, os.path.join(tmp, "workers.log"))
        workers.start()
        try:
            workers.wait_loaded()
        except RuntimeError as exc:
            result = RunResult(library=spec.library, scenario=spec.scenario.name, failure=str(exc))
        else:
            result = core_bench.run_in_child(spec, module="bench.redis_bench")
        result.extra["workers_stop"] = workers.stop()
        workers = None
        result.extra["left_in_redis"] = server.leftovers(spec.library, prefix)
        if result.failure or result.extra["workers_stop"]["how"] not in ("returned", "killed"):
            tail = harness.tail(os.path.join(tmp, "workers.log"))
            if tail.strip():
                print(f"--- workers' log ({spec.library}, {spec.scenario.name}) ---\n{tail}", file=sys.stderr)
        return result
    finally:
        if workers is not None:
            workers.kill()
        if server is not None:
            server.stop()
        shutil.rmtree(tmp, ignore_errors=True)


# -- the child: clients --------------------------------------------------------------------


def build_client(spec: RunSpec) -> Any:
    options = spec.options
    if spec.library == "ours":
        import streamer_core

        return streamer_core.RedisStreamer(options["broker"], prefix=options["prefix"])
    import service_streamer

    return service_streamer.RedisStreamer(redis_broker=options["broker"], prefix=options["prefix"])


def warm_up(streamer: Any, spec: RunSpec, timeout_s: float) -> None:
    """Send one request until the workers answer it (they may still be
    connecting); then it must be the right answer."""
    deadline = time.monotonic() + min(timeout_s, WARM_UP_LIMIT_S)
    value, expected = core_bench.make_payload(spec.scenario.payload, spec.scenario.clients)(0)
    while True:
        try:
            output = streamer.submit([value]).result(timeout=1.0)
        except TimeoutError:
            if time.monotonic() > deadline:
                raise RuntimeError(f"the workers did not answer within {WARM_UP_LIMIT_S:.0f}s") from None
            continue
        if len(output) != 1 or not expected(output[0]):
            raise RuntimeError(f"the warm-up request got a wrong answer: {output!r}")
        return


def close_client(streamer: Any, spec: RunSpec) -> None:
    if spec.library == "ours":
        streamer.close(timeout=core_bench.CLOSE_LIMIT_S / 2)
    # service_streamer's RedisStreamer cannot be closed (destroy_workers is not
    # implemented); its threads are daemons, and the child leaves with os._exit.


# -- the worker launcher ------------------------------------------------------------------


def workers_main(spec: RunSpec) -> int:
    """Run the library's ``run_redis_workers_forever`` (blocks)."""
    from bench import sim

    cost, options = spec.cost, spec.options
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s[%(process)d] %(levelname)s %(message)s")
    if spec.library == "ours":
        import streamer_core

        return streamer_core.run_redis_workers_forever(
            sim.SimModel, cost.batch_size, cost.max_latency_s, worker_num=spec.scenario.workers,
            redis_broker=options["broker"], prefix=options["prefix"],
            model_init_kwargs={"fixed_ms": cost.fixed_ms, "per_item_ms": cost.per_item_ms},
        )  # fmt: skip
    import service_streamer

    # Its workers drop model_init_kwargs: RedisLegacySimModel reads the costs from the environment.
    service_streamer.run_redis_workers_forever(
        sim.RedisLegacySimModel, cost.batch_size, cost.max_latency_s, worker_num=spec.scenario.workers,
        redis_broker=options["broker"], prefix=options["prefix"],
    )  # fmt: skip
    return 0


# -- the parent --------------------------------------------------------------------------


def _stop_text(outcomes: List[Dict[str, Any]]) -> str:
    """How the workers of every run of one row stopped, in a few words."""
    if not outcomes:
        return "-"
    left = sum(o.get("left", 0) for o in outcomes)
    hows = [o["how"] for o in outcomes]
    if all(how == "killed" for how in hows):
        text = "killed (never exit)"
    elif all(how == "returned" and o.get("code") == 0 for how, o in zip(hows, outcomes)):
        text = f"SIGTERM: exit 0 in {max(o['seconds'] for o in outcomes):.1f} s"
    else:
        text = ", ".join(
            f"{o['how']}"
            + (f" code {o['code']}" if "code" in o else "")
            + (f" {o['seconds']:.1f} s" if "seconds" in o else "")
            for o in outcomes
        )
    return text + (f", {left} process(es) left and killed" if left else "")


def _left_text(values: List[str]) -> str:
    dirty = [v for v in values if v]
    if not dirty:
        return "nothing"
    return f"{len(dirty)}/{len(values)} runs: {dirty[0]}"


def _note(result: RunResult) -> str:
    parts = []
    if "workers_stop" in result.extra:
        parts.append("workers " + _stop_text([result.extra["workers_stop"]]))
    for command in result.extra.get("workers_stop", {}).get("left_commands", []):
        parts.append(f"left running: {command}")
    if result.extra.get("left_in_redis"):
        parts.append("left in Redis: " + result.extra["left_in_redis"])
    return "; ".join(parts)


def _parse_args(argv: Optional[Sequence[str]]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.redis_bench",
        description="Closed-loop benchmark of the Redis backend: streamer_core next to service_streamer 0.1.2.",
    )
    core_bench.add_common_args(parser, SCENARIOS)
    parser.add_argument(
        "--launcher", choices=["api", "cli"], default="api",
        help="how streamer_core's workers start: run_redis_workers_forever (api, default) or streamer-worker (cli)",
    )  # fmt: skip
    parser.add_argument("--redis-server", default=shutil.which("redis-server"), help="the redis-server binary")
    parser.add_argument("--workers-process", metavar="SPEC_JSON", help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = _parse_args(argv)
    if args.child:
        core_bench.child_main(args.child, args.result_file, build=build_client, wait_ready=warm_up, close=close_client)
    if args.workers_process:
        return workers_main(RunSpec.from_json(args.workers_process))
    if not args.redis_server:
        raise SystemExit("redis-server not found: install it or pass --redis-server PATH")
    cost, scenarios, specs = core_bench.plan(args, SCENARIOS)
    header = (
        core_bench.header_line(cost, args)
        + f"; private redis-server per run, streamer_core workers via {args.launcher}"
    )
    print(header, file=sys.stderr)

    # Ctrl-C and SIGTERM unwind through the finally blocks, which stop every process started.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    started = time.monotonic()
    try:
        runs = core_bench.run_all(
            specs, args.repeat, lambda spec: run_one(spec, args.redis_server, args.launcher), _note
        )
    finally:
        harness.kill_everything_left()
    results = []
    for spec in specs:
        pair_runs = runs[(spec.library, spec.scenario.name)]
        summary = core_bench.summarize(pair_runs)
        summary.extra = dict(summary.extra)
        summary.extra["stop_text"] = _stop_text(
            [r.extra["workers_stop"] for r in pair_runs if "workers_stop" in r.extra]
        )
        summary.extra["left_text"] = _left_text([r.extra.get("left_in_redis", "") for r in pair_runs])
        results.append(summary)

    by_name = {s.name: s for s in scenarios}
    columns = [
        ("workers stopped", lambda r: r.extra.get("stop_text", "-")),
        ("left in Redis", lambda r: r.extra.get("left_text", "-")),
    ]
    print()
    print(header)
    print()
    print(core_bench.results_table(results, by_name, cost, columns))
    print()
    print(core_bench.targets_table(results, cost, REDIS_TARGETS, SCENARIOS))
    print(f"\n(total {time.monotonic() - started:.0f} s)")
    if args.json:
        core_bench.write_json(args.json, cost, header, specs, runs, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
