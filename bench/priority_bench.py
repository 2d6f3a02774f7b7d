"""Priority levels under overload: a trickle of interactive requests beside
bulk callers that keep the model full, with levels and without.

    .venv/bin/python -m bench.priority_bench                        # the simulated device, thread and Redis
    .venv/bin/python -m bench.priority_bench --model minilm         # the examples' real MiniLM on the CPU
    .venv/bin/python -m bench.priority_bench --backends thread --seconds 10

What runs, for each backend (``thread``: a ``ThreadedStreamer`` in this
process; ``redis``: a private ``redis-server``, two workers started by
``streamer-worker --workers 2``, a ``RedisStreamer`` here) and each of
"levels" (``priority_levels=2``: bulk at 2, interactive at 1) and "flat"
(one level, nobody names a priority):

- bulk callers in closed loops keeping ``--bulk-batches`` (4) batches of
  inputs in flight, in calls of ``--chunk`` inputs (a re-index sending
  chunks of documents);
- one interactive input every ``--interval`` seconds, open loop (sent on
  time whether the one before was answered or not), its latency from
  submit to answer;
- the model: ``sim``, the simulated device of :mod:`bench.sim` (a batch
  costs ``--fixed-ms + --per-item-ms`` per input, slept in libc with the
  GIL released, holding the OS thread as a device call does), or
  ``minilm``, ``example_models.embedding.SentenceEmbedder`` (the examples'
  all-MiniLM-L6-v2) on short sentences.

Printed per backend: interactive p50 and p99, bulk inputs per second, the
batch time measured under the load (workers x batch size / inputs per
second), and the floors, PASS or MISS (never asserted): with levels,
interactive p99 <= 2 batch times + max_latency; without, 10 times that or
worse; bulk throughput with levels within 5% of without.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from typing import Any, Callable, Dict, List, Optional, Sequence

from bench import harness

#: How long the workers of the Redis runs may take to load their model (seconds).
LOAD_LIMIT_S = 180.0
#: Words the MiniLM inputs are made of.
_WORDS = ("batch", "model", "search", "queue", "priority", "index", "query", "vector", "token", "answer", "level")


def _sentence(n: int) -> str:
    return " ".join(_WORDS[(n * 7 + k * 3) % len(_WORDS)] for k in range(8 + n % 9))


class Load:
    """The bulk callers and the interactive trickle against one streamer."""

    def __init__(self, streamer: Any, args: argparse.Namespace, levels: bool) -> None:
        self.streamer = streamer
        self.args = args
        self.levels = levels
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.bulk_done: List[float] = []  # the time each bulk input was answered
        self.answered: List[float] = []  # the time each interactive input was answered
        self.latencies: List[float] = []  # (sent at, latency) of each interactive input
        self.sent: List[float] = []
        self.errors: List[str] = []

    def value(self, n: int) -> Any:
        return _sentence(n) if self.args.model == "minilm" else n

    def bulk(self, index: int) -> None:
        chunk = self.args.chunk
        n = index * 1_000_000
        while not self.stop.is_set():
            batch = [self.value(n + i) for i in range(chunk)]
            n += chunk
            try:
                self.streamer.predict(batch, timeout=120, priority=2 if self.levels else None)
            except Exception as exc:  # counted, said once at the end
                self.errors.append(f"bulk: {type(exc).__name__}: {exc}")
                continue
            now = time.monotonic()
            with self.lock:
                self.bulk_done.extend([now] * chunk)

    def interactive(self) -> None:
        next_at = time.monotonic()
        n = 0
        while not self.stop.is_set():
            next_at += self.args.interval
            self.stop.wait(max(0.0, next_at - time.monotonic()))
            if self.stop.is_set():
                return
            sent = time.monotonic()
            future = self.streamer.submit([self.value(n)], timeout=120, priority=1 if self.levels else None)
            n += 1
            future.add_done_callback(lambda done, sent=sent: self._answered(done, sent))

    def _answered(self, future: Any, sent: float) -> None:
        now = time.monotonic()
        if future.exception() is not None:
            self.errors.append(f"interactive: {future.exception()!r}")
            return
        with self.lock:
            self.sent.append(sent)
            self.latencies.append(now - sent)

    def run(self, warm_up_s: float, seconds: float) -> Dict[str, Any]:
        callers = self.args.bulk_batches * self.args.batch_size // self.args.chunk
        threads = [threading.Thread(target=self.bulk, args=(i,), daemon=True) for i in range(callers)]
        threads.append(threading.Thread(target=self.interactive, daemon=True))
        for thread in threads:
            thread.start()
        start = time.monotonic() + warm_up_s
        end = start + seconds
        time.sleep(max(0.0, end - time.monotonic()))
        self.stop.set()
        for thread in threads:
            thread.join(130)
        with self.lock:
            bulk = sum(start <= t < end for t in self.bulk_done)
            latencies = sorted(lat for sent, lat in zip(self.sent, self.latencies) if start <= sent < end - 1.0)
        interactive_per_s = 1.0 / self.args.interval
        return {
            "bulk_per_s": bulk / seconds,
            "inputs_per_s": bulk / seconds + interactive_per_s,
            "p50": harness.percentile(latencies, 50),
            "p99": harness.percentile(latencies, 99),
            "samples": len(latencies),
            "errors": len(self.errors),
            "first_error": self.errors[0] if self.errors else "",
        }


# -- the backends ------------------------------------------------------------------------


def process_streamer(args: argparse.Namespace, levels: bool) -> Any:
    from streamer_core import Streamer

    if args.model == "sim":
        from bench.sim import SimModel as model

        kwargs: Dict[str, Any] = {"fixed_ms": args.fixed_ms, "per_item_ms": args.per_item_ms}
    else:
        from example_models.embedding import SentenceEmbedder as model  # type: ignore[assignment]

        kwargs = {}
    return Streamer(model, args.batch_size, args.max_latency, model_init_kwargs=kwargs,
                    priority_levels=2 if levels else 1, timeout=120, name="priority")  # fmt: skip


def thread_streamer(args: argparse.Namespace, levels: bool) -> Any:
    from streamer_core import ThreadedStreamer

    predict: Callable[[List[Any]], Any]
    if args.model == "sim":
        from bench import sim

        predict = sim.make_predict(args.fixed_ms, args.per_item_ms)
    else:
        from example_models.embedding import SentenceEmbedder
        from streamer_core.managed_model import load_predict

        predict = load_predict(SentenceEmbedder, None, (), {})
    return ThreadedStreamer(
        predict, args.batch_size, args.max_latency, priority_levels=2 if levels else 1, timeout=120, name="priority"
    )


class RedisWorkers:
    """Two workers (``streamer-worker --workers 2``) on a private Redis."""

    def __init__(self, args: argparse.Namespace, levels: bool, redis_url: str, prefix: str, folder: str) -> None:
        script = os.path.join(os.path.dirname(sys.executable), "streamer-worker")
        base = [script] if os.path.exists(script) else [sys.executable, "-m", "streamer_core.cli"]
        if args.model == "sim":
            model = ["bench.sim:SimModel", "--init-kwargs", json.dumps({"fixed_ms": args.fixed_ms,
                                                                        "per_item_ms": args.per_item_ms})]  # fmt: skip
        else:
            model = ["example_models.embedding:SentenceEmbedder"]
        command = base + model + [
            "--workers", "2", "--batch-size", str(args.batch_size), "--max-latency", str(args.max_latency),
            "--redis", redis_url, "--prefix", prefix, "--priority-levels", "2" if levels else "1",
            "--log-level", "WARNING",
        ]  # fmt: skip
        env = dict(
            os.environ, PYTHONPATH=os.pathsep.join(filter(None, [harness.REPO_ROOT, os.environ.get("PYTHONPATH")]))
        )
        env.update(OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")  # one core's worth each: two workers, two cores
        self.log = os.path.join(folder, f"workers-{prefix}.log")
        with open(self.log, "w") as log:
            self.proc = subprocess.Popen(command, cwd=harness.REPO_ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, start_new_session=True)  # fmt: skip
        harness.LIVE.add(self.proc)

    def wait_loaded(self, streamer: Any) -> None:
        deadline = time.monotonic() + LOAD_LIMIT_S
        while streamer.live_workers() < 2:
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the workers did not start: {harness.tail(self.log, 1500)}")
            time.sleep(0.1)

    def stop(self) -> None:
        harness.kill(self.proc)


def run_backend(backend: str, args: argparse.Namespace, redis: Optional[Any], folder: str) -> Dict[str, Any]:
    """The backend's runs, flat then with levels; the figures of each."""
    results = {}
    for levels in (False, True):
        workers = None
        if backend in ("thread", "process"):
            streamer = (thread_streamer if backend == "thread" else process_streamer)(args, levels)
            streamer.wait_ready(LOAD_LIMIT_S)
        else:
            from streamer_core import RedisStreamer

            assert redis is not None
            prefix = f"priority-{uuid.uuid4().hex[:8]}"
            url = f"redis://127.0.0.1:{redis.port}/0"
            workers = RedisWorkers(args, levels, url, prefix, folder)
            streamer = RedisStreamer(url, prefix, priority_levels=2 if levels else 1, timeout=120, name="priority")
            workers.wait_loaded(streamer)
        try:
            streamer.predict([Load(streamer, args, levels).value(0)] * args.batch_size, timeout=LOAD_LIMIT_S)  # warm
            figures = Load(streamer, args, levels).run(args.warm_up, args.seconds)
        finally:
            streamer.close(10)
            if workers is not None:
                workers.stop()
        workers_n = 2 if backend == "redis" else 1
        figures["batch_s"] = workers_n * args.batch_size / figures["inputs_per_s"]
        results["levels" if levels else "flat"] = figures
    return results


# -- the report --------------------------------------------------------------------------


def report(backend: str, results: Dict[str, Any], args: argparse.Namespace) -> List[str]:
    flat, levels = results["flat"], results["levels"]
    batch_s = flat["batch_s"]  # the model's own pace under the load, without levels
    floor = 2 * batch_s + args.max_latency

    def ms(value: Optional[float]) -> str:
        return "n/a" if value is None else f"{value * 1000:.0f}"

    lines = [
        f"{backend}: batch time under load {batch_s * 1000:.0f} ms (workers x batch size / inputs per second), "
        f"floor 2 batch times + max_latency = {floor * 1000:.0f} ms",
        "| run | interactive p50 ms | interactive p99 ms | samples | bulk inputs/s | errors |",
        "| --- | --: | --: | --: | --: | --: |",
    ]
    for name in ("flat", "levels"):
        run = results[name]
        lines.append(
            f"| {name} | {ms(run['p50'])} | {ms(run['p99'])} | {run['samples']} | {run['bulk_per_s']:.0f} | "
            f"{run['errors']} |"
        )
    p99_levels, p99_flat = levels["p99"], flat["p99"]
    ratio = None if p99_flat is None else p99_flat / floor
    throughput = levels["bulk_per_s"] / flat["bulk_per_s"] if flat["bulk_per_s"] else None

    def judged(value: Optional[float], ok: bool, shown: str) -> str:
        return "n/a" if value is None else f"{'PASS' if ok else 'MISS'} ({shown})"

    lines += [
        f"- with levels, interactive p99 <= {floor * 1000:.0f} ms: "
        + judged(p99_levels, p99_levels is not None and p99_levels <= floor, f"{ms(p99_levels)} ms"),
        "- without levels, interactive p99 >= 10x that: "
        + judged(ratio, ratio is not None and ratio >= 10, f"{ratio or 0:.1f}x"),
        "- bulk throughput with levels within 5% of without: "
        + judged(throughput, throughput is not None and throughput >= 0.95, f"{throughput or 0:.3f}"),
    ]
    for name in ("flat", "levels"):
        if results[name]["errors"]:
            lines.append(f"- {name}: {results[name]['errors']} errors, the first: {results[name]['first_error']}")
    return lines


def parse_args(argv: Optional[Sequence[str]]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.priority_bench", description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", choices=["sim", "minilm"], default="sim")
    parser.add_argument(
        "--backends", default="thread,redis", help="thread, redis or process (one worker), comma-separated"
    )
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--max-latency", type=float, default=0.02, help="seconds")
    parser.add_argument("--fixed-ms", type=float, default=10.0, help="sim: a batch's fixed cost")
    parser.add_argument("--per-item-ms", type=float, default=0.5, help="sim: each input's cost")
    parser.add_argument("--bulk-batches", type=int, default=4, help="bulk inputs kept in flight, in batches")
    parser.add_argument("--chunk", type=int, default=16, help="inputs per bulk call")
    parser.add_argument("--interval", type=float, default=0.1, help="seconds between interactive inputs")
    parser.add_argument("--seconds", type=float, default=15.0, help="measured, per run")
    parser.add_argument("--warm-up", type=float, default=3.0, help="seconds of load before measuring, per run")
    return parser.parse_args(argv)


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    backends = [name.strip() for name in args.backends.split(",") if name.strip()]
    print(
        f"model {args.model}, batch size {args.batch_size}, max_latency {args.max_latency} s, bulk "
        f"{args.bulk_batches} batches in flight in calls of {args.chunk}, one interactive input every "
        f"{args.interval} s, {args.seconds:.0f} s measured per run",
        flush=True,
    )
    with tempfile.TemporaryDirectory(prefix="priority-bench-") as folder:
        redis = None
        try:
            if "redis" in backends:
                redis = harness.PrivateRedis("redis-server", folder)
                redis.start()
            for backend in backends:
                results = run_backend(backend, args, redis, folder)
                print("\n".join(report(backend, results, args)), flush=True)
                print(flush=True)
        finally:
            if redis is not None:
                redis.stop()
            harness.kill_everything_left()
    return 0


if __name__ == "__main__":
    sys.exit(main())
