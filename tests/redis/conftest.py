"""Fixtures for the Redis backend tests: a Redis server, a key prefix per
test, streamers and workers that are always stopped, and a private,
restartable Redis server for the fault tests.

The shared server (``REDIS_URL``, or a private one started for the session)
is used only under each test's own prefix, and only those keys are deleted
at the end: never FLUSHALL. Tests that kill or restart anything use
``fault_broker``, a redis-server of their own on a free port.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import threading
import uuid
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence

import pytest

try:
    import redis
except ImportError:  # pragma: no cover - redis is in the test extra
    if os.environ.get("CI", "").lower() == "true":
        raise
    collect_ignore_glob = ["test_*.py"]  # no redis-py: nothing here can run

from streamer_core import RedisStreamer, RedisWorker  # noqa: E402
from tests.helpers import alive, stop_all, stop_each, wait_for  # noqa: E402,F401  (re-exported to the Redis tests)
from tests.servers import RedisServer, free_port, unavailable, worker_children  # noqa: E402,F401

ROOT = Path(__file__).resolve().parents[2]
_SCRIPT = Path(sys.executable).with_name("streamer-worker")
# The installed command; without it (not pip-installed), the same entry point by module.
CLI = [str(_SCRIPT)] if _SCRIPT.exists() else [sys.executable, "-m", "streamer_core.cli"]
GROUP = "workers"


class Broker:
    """One test's view of a Redis server: its URL, the test's own prefix, a
    connection for looking at the keys, and the server when it is private."""

    def __init__(self, url: str, server: Optional[RedisServer] = None) -> None:
        self.url = url
        self.server = server
        self.prefix = f"test-{uuid.uuid4().hex[:12]}"
        self.conn = redis.Redis.from_url(url, socket_timeout=5, socket_connect_timeout=2)
        self.requests = f"streamer:{self.prefix}:requests"

    def results(self, client_id: str) -> str:
        return f"streamer:{self.prefix}:results:{client_id}"

    def keys(self) -> List[str]:
        """The test's keys, but those whose names are not UTF-8 (a test may
        write such keys on purpose)."""
        names = []
        for key in self.conn.scan_iter(match=f"streamer:{self.prefix}*", count=1000):
            try:
                names.append(key.decode())
            except UnicodeDecodeError:
                continue
        return sorted(names)

    def result_keys(self) -> List[str]:
        return [k for k in self.keys() if ":results:" in k]

    def xlen(self, key: Optional[str] = None) -> int:
        return self.conn.xlen(key or self.requests)

    def pending(self) -> int:
        """Requests delivered to a worker and not acknowledged (the group's PEL)."""
        try:
            return int(self.conn.xpending(self.requests, GROUP)["pending"])
        except redis.ResponseError:  # no stream or group yet
            return 0

    def wait_queued(self, n: int, seconds: float = 5.0) -> None:
        assert wait_for(lambda: self.xlen() >= n, seconds), f"only {self.xlen()} of {n} requests reached Redis"

    def cleanup(self) -> None:
        try:
            keys = list(self.conn.scan_iter(match=f"streamer:{self.prefix}*", count=1000))
            if keys:
                self.conn.delete(*keys)
        except redis.RedisError:
            pass  # a private server that is down has nothing to clean
        finally:
            self.conn.close()


class Running:
    """Everything a test started, stopped at its end whatever happened:
    programs are killed (their process groups), thread workers told to stop,
    every streamer closed (in parallel), the workers joined, and only then
    the test's keys deleted and its private server stopped. Each stop waits
    out a blocking read, so doing them together keeps teardown short."""

    def __init__(self) -> None:
        self.processes: List[Processes] = []
        self.streamers: List[RedisStreamer] = []
        self.workers: List[ThreadWorker] = []
        self.finalizers: List[Callable[[], None]] = []  # after everything has stopped, in order
        self.brokers: List[Broker] = []

    def stop_all(self) -> None:
        """Stop everything, each step whatever an earlier one raised (a
        private server left running by a failed step outlives the run)."""
        stop_all(
            [
                *(processes.kill_all for processes in self.processes),
                *(handle.worker.stop for handle in self.workers),
                self._close_and_join,
                *self.finalizers,
            ]
        )

    def _close_and_join(self) -> None:
        closers = [threading.Thread(target=s.close, kwargs={"timeout": 2}) for s in self.streamers]
        for closer in closers:
            closer.start()
        done = threading.Event()
        nudger = threading.Thread(target=self._nudge, args=(done,), name="test-redis-nudge", daemon=True)
        if closers or self.workers:
            nudger.start()
        for closer in closers:
            closer.join(15)
        for handle in self.workers:
            handle.thread.join(10)
        done.set()
        if nudger.is_alive():
            nudger.join(5)
        # The heartbeat threads end a beat after their worker.
        for thread in threading.enumerate():
            if thread.name == "streamer-redis-heartbeat":
                thread.join(2)

    def _nudge(self, done: threading.Event) -> None:
        """Only to make teardown quick: a stopped streamer or worker notices
        it should stop when its blocking read returns, after up to 0.5 s; an
        entry in the streams it reads wakes it at once. (Workers drop these
        entries as malformed; web processes ignore answers they do not expect.)"""
        while not done.is_set():
            for b in self.brokers:
                try:
                    for key in [b.requests, *b.result_keys()]:
                        b.conn.xadd(key, {"nudge": "1"}, maxlen=10)
                except redis.RedisError:
                    pass
            done.wait(0.05)


@pytest.fixture
def running() -> Iterator[Running]:
    r = Running()
    yield r
    r.stop_all()


@pytest.fixture
def broker(redis_url: str, running: Running) -> Broker:
    """The session's Redis, under a prefix of this test's own (whose keys
    are deleted once everything the test started has stopped)."""
    b = Broker(redis_url)
    running.brokers.append(b)
    running.finalizers.append(b.cleanup)
    return b


@pytest.fixture
def fault_broker(tmp_path: Path, running: Running) -> Broker:
    """A private redis-server for this test alone, which it may kill and
    restart (``broker.server``); never the shared one."""
    if shutil.which("redis-server") is None:
        unavailable("the fault tests need redis-server on PATH")
    folder = tmp_path / "redis"
    folder.mkdir()
    server = None
    for _ in range(3):  # a free port can be taken between choosing and binding it
        server = RedisServer(folder)
        running.finalizers.append(server.kill)  # before it starts: stopped whatever happens from here
        try:
            server.start()
            break
        except RuntimeError:
            server = None
    if server is None:
        unavailable("could not start a private redis-server")
    b = Broker(server.url, server)
    running.brokers.append(b)
    running.finalizers.insert(0, b.cleanup)  # the test's keys, before the server stops
    return b


@pytest.fixture
def new_server(tmp_path: Path, running: Running) -> Callable[..., RedisServer]:
    """``new_server(extra_args=())``: a private redis-server, not started yet
    (the test starts it when it wants); killed at the end of the test."""
    if shutil.which("redis-server") is None:
        unavailable("this test needs redis-server on PATH")

    def make(extra_args: Sequence[str] = ()) -> RedisServer:
        folder = tmp_path / f"redis-{uuid.uuid4().hex[:6]}"
        folder.mkdir()
        server = RedisServer(folder, extra_args=extra_args)
        running.finalizers.append(server.kill)
        return server

    return make


@pytest.fixture
def make_streamer(running: Running) -> Callable[..., RedisStreamer]:
    """``make_streamer(broker, **options)``: a RedisStreamer on the test's
    prefix, closed at the end of the test."""

    def make(broker: Broker, **options: Any) -> RedisStreamer:
        options.setdefault("timeout", 10)
        streamer = RedisStreamer(broker.url, broker.prefix, **options)
        running.streamers.append(streamer)
        return streamer

    return make


class ThreadWorker:
    """A RedisWorker serving in a thread of the test process."""

    def __init__(self, worker: RedisWorker, gpu_id: Any = None) -> None:
        self.worker = worker
        self.error: Optional[BaseException] = None
        self.thread = threading.Thread(target=self._serve, args=(gpu_id,), name="test-redis-worker", daemon=True)

    def _serve(self, gpu_id: Any) -> None:
        try:
            self.worker.run_forever(gpu_id)
        except BaseException as exc:  # kept for the test to look at
            self.error = exc

    def alive(self) -> bool:
        return self.thread.is_alive()

    def stop(self, timeout: float = 10.0) -> None:
        self.worker.stop()
        self.thread.join(timeout)
        assert not self.thread.is_alive(), "the worker did not stop"


@pytest.fixture
def start_worker(running: Running) -> Callable[..., ThreadWorker]:
    """``start_worker(broker, model, batch_size, max_latency=0.01, **options)``:
    a RedisWorker in a background thread, stopped at the end of the test."""

    def start(
        broker: Broker, model: Any, batch_size: int = 8, max_latency: float = 0.01, **options: Any
    ) -> ThreadWorker:
        options.setdefault("claim_after", 0.5)
        worker = RedisWorker(model, batch_size, max_latency, redis_broker=broker.url, prefix=broker.prefix, **options)
        handle = ThreadWorker(worker)
        handle.thread.start()
        running.workers.append(handle)
        return handle

    return start


class Processes:
    """Programs started by a test, each in a session of its own, so the whole
    group (a supervisor and its workers) is killed at the end whatever happens."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.started: List[subprocess.Popen] = []
        self.logs: Dict[int, Path] = {}

    def popen(self, args: List[str], *, name: str = "proc", capture_stdout: bool = False) -> subprocess.Popen:
        log_path = self.folder / f"{name}-{len(self.started)}.log"
        env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"}
        env.pop("CUDA_VISIBLE_DEVICES", None)
        with open(log_path, "wb") as log:
            process = subprocess.Popen(
                args,
                cwd=ROOT,
                env=env,
                start_new_session=True,
                stdout=subprocess.PIPE if capture_stdout else log,
                stderr=log,
            )
        self.started.append(process)
        self.logs[process.pid] = log_path
        return process

    def python(self, spec: Dict[str, Any], **kwargs: Any) -> subprocess.Popen:
        return self.popen([sys.executable, "-m", "tests.redis.models", json.dumps(spec)], **kwargs)

    def worker(
        self, broker: Broker, model: str, batch_size: int = 8, max_latency: float = 0.01, **options: Any
    ) -> subprocess.Popen:
        """One RedisWorker process (no supervisor: nothing restarts it)."""
        options.setdefault("claim_after", 0.5)
        spec = dict(
            mode="worker",
            model=model,
            batch_size=batch_size,
            max_latency=max_latency,
            redis_broker=broker.url,
            prefix=broker.prefix,
            **options,
        )
        return self.python(spec, name="worker")

    def supervisor(
        self, broker: Broker, model: str, batch_size: int = 8, max_latency: float = 0.01, **options: Any
    ) -> subprocess.Popen:
        """``run_redis_workers_forever`` in a process of its own."""
        options.setdefault("claim_after", 0.5)
        spec = dict(
            mode="supervise",
            model=model,
            batch_size=batch_size,
            max_latency=max_latency,
            redis_broker=broker.url,
            prefix=broker.prefix,
            **options,
        )
        return self.python(spec, name="supervisor")

    def cli(self, broker: Broker, *args: str) -> subprocess.Popen:
        return self.popen([*CLI, *args, "--redis", broker.url, "--prefix", broker.prefix], name="cli")

    def log(self, process: subprocess.Popen, tail: Optional[int] = 6000) -> str:
        text = self.logs[process.pid].read_text(errors="replace")
        return text if tail is None else text[-tail:]

    def all_logs(self) -> str:
        return "\n".join(
            f"--- pid {pid} ---\n{path.read_text(errors='replace')[-3000:]}" for pid, path in self.logs.items()
        )

    def kill_all(self) -> None:
        stop_each(self.started)  # each group: a supervisor's workers too
        for process in self.started:
            if process.stdout is not None:
                process.stdout.close()


@pytest.fixture
def procs(tmp_path: Path, running: Running) -> Processes:
    """Start programs (workers, supervisors, the CLI, web processes); they
    are killed, process group and all, at the end of the test."""
    folder = tmp_path / "procs"
    folder.mkdir()
    p = Processes(folder)
    running.processes.append(p)
    return p


def outcomes_of(futures: Sequence[Any], timeout: float) -> List[Any]:
    """Each future's result, or the StreamerError it ended with (a clear
    error is an allowed outcome; anything else fails the test)."""
    from streamer_core import StreamerError

    outcomes: List[Any] = []
    for future in futures:
        try:
            outcomes.append(future.result(timeout))
        except StreamerError as exc:
            outcomes.append(exc)
    return outcomes


def wait_serving(procs: Processes, process: subprocess.Popen, pids: List[int], seconds: float = 30.0) -> None:
    """Wait until each worker ``pids`` (the process itself, or the workers of
    a supervisor) has logged that it serves, i.e. its model is loaded and it
    is about to read from Redis."""

    def serving() -> bool:
        text = procs.log(process, tail=None)
        return all(re.search(rf"worker \S+-{pid}-\w+ serving", text) for pid in pids)

    assert wait_for(serving, seconds, 0.05), f"workers {pids} did not start serving:\n{procs.log(process)}"
