"""A retry storm over HTTP: how many answers are read, and how much of the
model's work nobody reads, when callers give up and ask again.

    .venv/bin/python -m bench.overload_bench                        # every variant, about 8 minutes
    .venv/bin/python -m bench.overload_bench --variants flask-thread --header both

The scenario of issue #65: one batched route on a simulated device of 80
inputs a second (:mod:`bench.sim`: a batch of 8 takes 0.1 s; the Redis
backend's two workers 0.2 s each, 80 a second together), served by
gunicorn's gevent worker (``-k gevent_pywsgi``, one process, the
examples' hooks), under ``--clients`` HTTP callers (160, twice what the
device serves in their patience) that each give up after ``--patience``
seconds (1), closing their connection, and ask again at once, answered or
not. ``--header``: whether the callers say their patience
(``X-Request-Timeout``), ``no``, ``yes`` or ``both``. Measured over
``--seconds`` (15) after ``--warm-up`` (5): answers read a second, and the
share of the inputs the model ran whose answer nobody read.

Without overload (``--calm N``: N callers, fewer than a batch, each waiting
as long as it takes), each variant's latency, p50 and p99, against the
same variant served by another checkout's ``streamer_core``
(``--library PATH``, e.g. a ``git worktree`` of the commit before).

Variants (``--variants``, comma-separated): ``flask-thread``,
``django-thread``, ``flask-process``, ``flask-redis`` (two workers on a
private ``redis-server``), ``service_streamer`` (0.1.2's
``ThreadedStreamer`` in a Flask view, under ``-k gthread --threads 256``:
under gevent's patching its model thread would be a greenlet and block
the server; needs the ``bench`` extra). Never asserted: the floors of
#65 are printed PASS or MISS.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

from bench import harness

ROOT = Path(__file__).resolve().parents[1]
APPS = ROOT / "bench" / "apps"
VARIANTS = ("flask-thread", "django-thread", "flask-process", "flask-redis", "service_streamer")


class Server:
    """One variant's server (and, for Redis, its workers), on a free port."""

    def __init__(self, variant: str, library: Path, folder: Path, redis_url: Optional[str], settings: Dict[str, Any]):
        self.variant = variant
        self.port = harness.free_port()
        self.ran_dir = folder / "ran"
        self.ran_dir.mkdir(parents=True, exist_ok=True)
        self.processes: List[subprocess.Popen[bytes]] = []
        self.library = library
        prefix = f"overload-{os.getpid()}-{variant}-{folder.name}"  # each server's own keys
        redis = variant.endswith("-redis")
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join([str(library), str(ROOT), str(APPS)]),
            "OVERLOAD_BACKEND": variant.split("-", 1)[1] if "-" in variant else "thread",
            "OVERLOAD_RAN_DIR": str(self.ran_dir),
            "OVERLOAD_FIXED_MS": "200" if redis else "100",  # two workers of half the speed: 80 a second
            "OVERLOAD_PREFIX": prefix,
            "OVERLOAD_SETTINGS": json.dumps(settings),
            "PIN_WORKERS": "0",
            "BIND": f"127.0.0.1:{self.port}",
            "WEB_CONCURRENCY": "1",
        }
        if redis:
            assert redis_url is not None
            env["OVERLOAD_REDIS_URL"] = redis_url
            kwargs = {"ran_dir": str(self.ran_dir), "fixed_ms": 200.0, "per_item_ms": 0.0}
            worker = [
                sys.executable, "-m", "streamer_core.cli", "overload_app:Device", "--redis", redis_url,
                "--prefix", prefix, "--workers", "2", "--batch-size", "8", "--max-latency", "0.01",
                "--init-kwargs", json.dumps(kwargs), "--log-level", "WARNING",
            ]  # fmt: skip
            self._start(worker, env, folder / "workers.log")
        if variant == "service_streamer":
            app, conf = "overload_app:service_streamer_app()", ["-k", "gthread", "--threads", "256"]
        elif variant.startswith("django"):
            app, conf = "overload_app:django_application", ["-c", str(ROOT / "example_django" / "gunicorn.conf.py")]
        else:
            app, conf = "overload_app:flask_app()", ["-c", str(ROOT / "example_flask" / "gunicorn.conf.py")]
        server = [sys.executable, "-m", "gunicorn", *conf, "-w", "1", "--bind", f"127.0.0.1:{self.port}", app]
        self._start(server, env, folder / "server.log")
        self.log = folder / "server.log"

    def _start(self, argv: List[str], env: Dict[str, str], log: Path) -> None:
        with open(log, "wb") as out:
            self.processes.append(
                # Run from the library's checkout: python -m puts its folder first on the path.
                subprocess.Popen(
                    argv, cwd=self.library, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
                )
            )

    def ran(self, start: float, end: float) -> List[int]:
        """The request numbers of the inputs run in batches ended within the window."""
        numbers: List[int] = []
        for path in self.ran_dir.glob("*.log"):
            for line in path.read_text().splitlines():
                ended, *batch = line.split()
                if start <= float(ended) < end:
                    numbers.extend(int(x) for x in batch)
        return numbers

    def stop(self) -> None:
        for process in self.processes:
            harness.kill(process)


async def _exchange(port: int, number: int, patience: Optional[float], header: bool) -> Tuple[int, Any, Any]:
    """One request on a new connection: its status (0: given up), and the
    connection's reader and writer, kept open on an answer."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    return await _request(reader, writer, number, patience, header)


async def _request(
    reader: Any, writer: Any, number: int, patience: Optional[float], header: bool
) -> Tuple[int, Any, Any]:
    body = json.dumps({"n": number}).encode()
    head = (
        f"POST /predict HTTP/1.1\r\nHost: bench\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n"
        + (f"X-Request-Timeout: {patience}\r\n" if header and patience else "")
        + "\r\n"
    )
    writer.write(head.encode() + body)
    try:
        status = await asyncio.wait_for(_response(reader), patience)
    except (TimeoutError, ConnectionError, asyncio.IncompleteReadError):
        writer.close()  # the caller leaves: the server sees its socket closed
        return 0, None, None
    return status, reader, writer


async def _response(reader: Any) -> int:
    status_line = await reader.readline()
    if not status_line:
        raise ConnectionError("closed")
    status = int(status_line.split()[1])
    length, chunked = 0, False
    while True:
        line = await reader.readline()
        if line in (b"\r\n", b"\n", b""):
            break
        name, _, value = line.decode("latin-1").partition(":")
        name = name.strip().lower()
        if name == "content-length":
            length = int(value)
        elif name == "transfer-encoding" and "chunked" in value.lower():
            chunked = True
    if not chunked:
        await reader.readexactly(length)
        return status
    while True:  # a body in chunks: each size line, the chunk, its line end; a last chunk of 0
        size = int((await reader.readline()).split(b";")[0], 16)
        await reader.readexactly(size + 2)
        if size == 0:
            return status


class Load:
    """``clients`` callers in closed loops, each giving up after ``patience``."""

    def __init__(self, port: int, clients: int, patience: Optional[float], header: bool) -> None:
        self.port, self.clients, self.patience, self.header = port, clients, patience, header
        self.next = 0
        self.read: Dict[int, float] = {}  # request number -> when its answer was read
        self.latency: List[Tuple[float, float]] = []  # (when answered, seconds)
        self.statuses: Dict[int, int] = {}
        self.stop = False

    async def caller(self) -> None:
        reader = writer = None
        while not self.stop:
            self.next += 1
            number = self.next
            started = time.monotonic()
            try:
                if writer is None:
                    status, reader, writer = await _exchange(self.port, number, self.patience, self.header)
                else:
                    status, reader, writer = await _request(reader, writer, number, self.patience, self.header)
            except OSError:
                status, reader, writer = -1, None, None
                await asyncio.sleep(0.05)
            now = time.monotonic()
            self.statuses[status] = self.statuses.get(status, 0) + 1
            if status == 200:
                self.read[number] = now
                self.latency.append((now, now - started))

    async def run(self, warm_up: float, seconds: float) -> Tuple[float, float]:
        tasks = [asyncio.ensure_future(self.caller()) for _ in range(self.clients)]
        start = time.monotonic() + warm_up
        end = start + seconds
        await asyncio.sleep(end - time.monotonic())
        self.stop = True
        await asyncio.sleep((self.patience or 5.0) + 0.5)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        return start, end


def _wait_up(server: Server, seconds: float = 120.0) -> None:
    async def answered() -> bool:
        try:
            status, _, writer = await _exchange(server.port, 0, 10.0, False)
        except OSError:
            return False
        if writer is not None:
            writer.close()
        return status == 200

    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if asyncio.run(answered()):
            return
        time.sleep(0.5)
    raise RuntimeError(f"{server.variant} did not start: {harness.tail(str(server.log))}")


def storm(server: Server, args: argparse.Namespace, header: bool) -> Dict[str, float]:
    load = Load(server.port, args.clients, args.patience, header)
    start, end = asyncio.run(load.run(args.warm_up, args.seconds))
    read = {n for n, at in load.read.items() if start <= at < end}
    ran = server.ran(start, end)
    unread = sum(n not in load.read for n in ran)
    return {
        "read_per_s": len(read) / args.seconds,
        "ran_per_s": len(ran) / args.seconds,
        "unread": unread / len(ran) if ran else 0.0,
        "refused": sum(count for status, count in load.statuses.items() if status not in (0, 200)),
        "statuses": {str(status): count for status, count in sorted(load.statuses.items())},
    }


def calm(server: Server, args: argparse.Namespace) -> Dict[str, float]:
    load = Load(server.port, args.calm, None, False)
    start, end = asyncio.run(load.run(args.warm_up, args.seconds))
    seconds = sorted(s for at, s in load.latency if start <= at < end)
    return {
        "p50_ms": 1000 * (harness.percentile(seconds, 50) or 0.0),
        "p99_ms": 1000 * (harness.percentile(seconds, 99) or 0.0),
        "per_s": len(seconds) / args.seconds,
    }


def run_variant(variant: str, library: Path, args: argparse.Namespace, redis_url: Optional[str]) -> Dict[str, Any]:
    results: Dict[str, Any] = {}
    headers = {"no": [False], "yes": [True], "both": [False, True], "skip": []}[args.header]
    with tempfile.TemporaryDirectory(prefix="overload-bench-") as folder:
        for header in headers:
            server = Server(variant, library, Path(folder) / f"storm-{header}", redis_url, {})
            try:
                _wait_up(server)
                results["header" if header else "no header"] = storm(server, args, header)
            finally:
                server.stop()
        if args.calm:
            server = Server(variant, library, Path(folder) / "calm", redis_url, {})
            try:
                _wait_up(server)
                results["calm"] = calm(server, args)
            finally:
                server.stop()
    return results


def parse_args(argv: Optional[Sequence[str]]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.overload_bench", description=__doc__.split("\n\n")[0])
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--clients", type=int, default=160)
    parser.add_argument("--patience", type=float, default=1.0, help="seconds a caller waits before it asks again")
    parser.add_argument(
        "--header",
        choices=["no", "yes", "both", "skip"],
        default="both",
        help="whether callers say their patience; skip: no storm (with --calm, latency only)",
    )
    parser.add_argument("--seconds", type=float, default=15.0)
    parser.add_argument("--warm-up", type=float, default=5.0)
    parser.add_argument("--calm", type=int, default=0, help="also measure N patient callers' latency (0: not)")
    parser.add_argument(
        "--library", default=str(ROOT), help="the checkout whose streamer_core the servers import (default: this one)"
    )
    return parser.parse_args(argv)


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    variants = [v for v in args.variants.split(",") if v]
    unknown = set(variants) - set(VARIANTS)
    if unknown:
        raise SystemExit(f"unknown variants {sorted(unknown)}; choose from {', '.join(VARIANTS)}")
    library = Path(args.library).resolve()
    print(
        f"{args.clients} callers, patience {args.patience} s, then they ask again; the device serves 80 inputs/s; "
        f"{args.seconds:.0f} s measured after {args.warm_up:.0f} s; streamer_core from {library}",
        flush=True,
    )
    redis_dir = tempfile.mkdtemp(prefix="overload-redis-")
    redis: Optional[harness.PrivateRedis] = None
    if any(v.endswith("redis") for v in variants):
        redis = harness.PrivateRedis("redis-server", redis_dir)
        redis.start()
    redis_url = f"redis://127.0.0.1:{redis.port}/0" if redis is not None else None
    try:
        results: Dict[str, Any] = {}
        for variant in variants:
            try:
                results[variant] = run_variant(variant, library, args, redis_url)
            except Exception as exc:  # one variant's failure is reported, the others still run
                results[variant] = {"error": str(exc)}
            print(f"{variant}: {json.dumps(results[variant])}", flush=True)
    finally:
        if redis is not None:
            redis.stop()
    print("| variant | caller's patience told | answers read/s | inputs run/s | run, unread | refused |")
    print("| --- | --- | --: | --: | --: | --: |")
    for variant, result in results.items():
        for kind in ("no header", "header"):
            row = result.get(kind)
            if row:
                print(
                    f"| {variant} | {'yes' if kind == 'header' else 'no'} | {row['read_per_s']:.1f} | "
                    f"{row['ran_per_s']:.1f} | {row['unread'] * 100:.1f}% | {row['refused']} |"
                )
    for variant, result in results.items():
        if "calm" in result:
            row = result["calm"]
            print(f"- {variant}, {args.calm} patient callers: p50 {row['p50_ms']:.1f} ms, p99 {row['p99_ms']:.1f} ms")
    for variant, result in results.items():
        plain, told = result.get("no header"), result.get("header")
        if variant == "service_streamer":
            continue
        if plain:
            ok = plain["read_per_s"] >= 56 and plain["unread"] <= 0.10
            print(f"- {variant}, no header: >= 56 read/s and <= 10% unread: {'PASS' if ok else 'MISS'}")
        if told:
            ok = told["read_per_s"] >= 72 and told["unread"] <= 0.05
            print(f"- {variant}, header: >= 72 read/s and <= 5% unread: {'PASS' if ok else 'MISS'}")
    return 0


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))
    sys.exit(main())
