"""Live servers for the tests: start one as a real subprocess (in its own
process group, killed whole at the end), wait until it answers, and fire
concurrent requests at it.

The servers load :mod:`tests.flask.servers_app` from the repository root.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Sequence

from tests.servers import free_port, kill_group

ROOT = Path(__file__).resolve().parents[2]
APP = "tests.flask.servers_app:create_app()"
HOST = "127.0.0.1"

# Runner scripts (python -c) for gevent's WSGIServer. The unpatched one never
# calls patch_all: every request is a greenlet on one OS thread.
_GEVENT_RUNNER = (
    "import sys\n"
    "from gevent.pywsgi import WSGIServer\n"
    "from tests.flask.servers_app import create_app\n"
    "WSGIServer(('127.0.0.1', int(sys.argv[1])), create_app(), log=None).serve_forever()\n"
)
_PATCHED_GEVENT_RUNNER = "from gevent import monkey; monkey.patch_all()\n" + _GEVENT_RUNNER


def flask_dev_argv(port: int) -> List[str]:
    """``flask run``: the development server, threaded (its default; said explicitly)."""
    return [
        sys.executable,
        "-m",
        "flask",
        "--app",
        APP,
        "run",
        "--host",
        HOST,
        "--port",
        str(port),
        "--with-threads",
        "--no-reload",
        "--no-debugger",
    ]


def gunicorn_argv(port: int, *options: str) -> List[str]:
    return [
        sys.executable,
        "-m",
        "gunicorn",
        "-b",
        f"{HOST}:{port}",
        "--log-level",
        "warning",
        "--graceful-timeout",
        "1",
        *options,
        APP,
    ]


def uwsgi_argv(port: int, *options: str) -> List[str]:
    """uWSGI serving the app over HTTP, as its docs start it (``--master``
    and the process and thread counts are the test's)."""
    uwsgi = Path(sys.executable).with_name("uwsgi")
    return [
        str(uwsgi),
        "--http-socket",
        f"{HOST}:{port}",
        "--module",
        "tests.flask.servers_wsgi:application",
        "--disable-logging",
        "--die-on-term",
        *options,
    ]


def granian_argv(port: int, *options: str) -> List[str]:
    """granian serving the app's WSGI module over HTTP (its Rust server;
    each request on one of ``--blocking-threads``)."""
    return [
        sys.executable, "-m", "granian", "--interface", "wsgi", "--host", HOST, "--port", str(port),
        "--no-ws", "--log-level", "warning", *options, "tests.flask.servers_wsgi:application",
    ]  # fmt: skip


def gevent_argv(port: int, patched: bool) -> List[str]:
    return [sys.executable, "-c", _PATCHED_GEVENT_RUNNER if patched else _GEVENT_RUNNER, str(port)]


class LiveServer:
    """One server subprocess on ``127.0.0.1:port``."""

    def __init__(self, argv: Sequence[str], port: int, env: Dict[str, str], log: Path) -> None:
        self.argv = list(argv)
        self.port = port
        self.env = env
        self.log = log
        self.process: Optional[subprocess.Popen] = None

    def start(self, timeout: float = 30.0) -> None:
        with open(self.log, "wb") as out:
            self.process = subprocess.Popen(
                self.argv,
                cwd=ROOT,
                env=self.env,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(
                    f"the server exited with {self.process.returncode} before answering:\n"
                    f"{' '.join(self.argv)}\n{self.output()}"
                )
            try:
                status, body, _ = get(self.port, "/ping", timeout=1.0)
            except OSError:
                time.sleep(0.05)
                continue
            if status == 200 and isinstance(body, dict) and self.ours(body.get("pid", -1)):
                return
            raise RuntimeError(f"something else answers on port {self.port}: {status} {body!r}")
        raise RuntimeError(f"the server did not answer within {timeout}s:\n{' '.join(self.argv)}\n{self.output()}")

    def ours(self, pid: int) -> bool:
        """Whether ``pid`` (the process that answered) belongs to this server."""
        assert self.process is not None
        try:
            return os.getpgid(pid) == self.process.pid
        except ProcessLookupError:
            return False

    def kill(self) -> None:
        """SIGKILL to the whole process group: the server and its workers."""
        if self.process is None:
            return
        kill_group(self.process)

    def output(self) -> str:
        try:
            return self.log.read_text(errors="replace")[-4000:]
        except OSError:
            return ""


@contextlib.contextmanager
def live_server(
    argv: Sequence[str], port: int, settings: Optional[Dict[str, Any]] = None, timeout: float = 30.0
) -> Iterator[LiveServer]:
    """Run a server with ``settings`` as ``FLASK_*`` variables (JSON values)
    for the ``with`` block; it is killed on the way out, whatever happens."""
    env = {key: value for key, value in os.environ.items() if not key.startswith(("FLASK_", "GUNICORN_"))}
    env["PYTHONPATH"] = str(ROOT) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env["PYTHONUNBUFFERED"] = "1"
    for key, value in (settings or {}).items():
        env[f"FLASK_{key}"] = json.dumps(value)
    with tempfile.TemporaryDirectory(prefix="live-server-") as folder:
        server = LiveServer(argv, port, env, Path(folder) / "server.log")
        try:
            server.start(timeout)
            yield server
        finally:
            server.kill()


# -- the client -------------------------------------------------------------------


def get(port: int, path: str, timeout: float = 10.0) -> tuple[int, Any, float]:
    """``GET path``: (status, JSON body, seconds)."""
    return _request(port, "GET", path, None, timeout)


def post(port: int, path: str, payload: Any, timeout: float = 10.0) -> tuple[int, Any, float]:
    """``POST path`` with a JSON body: (status, JSON body, seconds)."""
    return _request(port, "POST", path, payload, timeout)


def _request(port: int, method: str, path: str, payload: Any, timeout: float) -> tuple[int, Any, float]:
    started = time.monotonic()
    conn = http.client.HTTPConnection(HOST, port, timeout=timeout)
    try:
        if payload is None:
            conn.request(method, path, headers={"Connection": "close"})
        else:
            conn.request(
                method,
                path,
                body=json.dumps(payload),
                headers={"Content-Type": "application/json", "Connection": "close"},
            )
        response = conn.getresponse()
        data = response.read()
    finally:
        conn.close()
    elapsed = time.monotonic() - started
    try:
        body = json.loads(data)
    except ValueError:
        body = data.decode(errors="replace")
    return response.status, body, elapsed


@dataclass
class Reply:
    sent: Any
    status: int  # -1: no HTTP answer (see error)
    body: Any = None
    seconds: float = 0.0
    error: str = ""


@dataclass
class Volley:
    """What ``fire`` got back."""

    replies: List[Reply]
    seconds: float
    problems: List[str] = field(default_factory=list)

    def statuses(self) -> Dict[int, int]:
        counts: Dict[int, int] = {}
        for reply in self.replies:
            counts[reply.status] = counts.get(reply.status, 0) + 1
        return counts

    def batch_sizes(self) -> List[int]:
        return [reply.body["batch"] for reply in self.replies if reply.status == 200]

    def max_batch(self) -> int:
        return max(self.batch_sizes(), default=0)

    def mean_batch(self) -> float:
        """The mean size of the batches these requests were in, each batch
        counted once (a request in a batch of b stands for 1/b of it), so a
        few large batches among many single ones do not inflate it."""
        sizes = self.batch_sizes()
        return len(sizes) / sum(1.0 / b for b in sizes) if sizes else 0.0

    def pids(self) -> set[int]:
        return {reply.body["pid"] for reply in self.replies if reply.status == 200}

    def summary(self) -> str:
        sizes = self.batch_sizes()
        histogram: Dict[int, int] = {}
        for size in sizes:
            histogram[size] = histogram.get(size, 0) + 1
        errors = sorted({reply.error or repr(reply.body)[:200] for reply in self.replies if reply.status != 200})
        return (
            f"{len(self.replies)} requests in {self.seconds:.2f}s, statuses {self.statuses()}, "
            f"batch sizes seen by requests {dict(sorted(histogram.items()))}, mean batch {self.mean_batch():.1f}"
            + (f", errors {errors[:5]}" if errors else "")
        )

    def check_answers(self) -> None:
        """Every request got 200 and its own input back."""
        assert self.statuses() == {200: len(self.replies)}, self.summary()
        wrong = [(r.sent, r.body) for r in self.replies if r.body.get("x") != r.sent]
        assert not wrong, f"requests got answers that were not theirs: {wrong[:5]}"


def fire(port: int, path: str, clients: int, per_client: int, timeout: float = 30.0, tag: str = "") -> Volley:
    """``clients`` threads start together, each POSTing ``per_client``
    requests one after the other (a closed loop), each with its own input
    ``{"c": client, "k": k, "tag": tag}``."""
    barrier = threading.Barrier(clients)
    replies: List[List[Reply]] = [[] for _ in range(clients)]

    def client(c: int) -> None:
        try:
            barrier.wait(timeout)
        except threading.BrokenBarrierError:
            pass
        for k in range(per_client):
            sent = {"c": c, "k": k, "tag": tag}
            try:
                status, body, seconds = post(port, path, sent, timeout)
                replies[c].append(Reply(sent, status, body, seconds))
            except Exception as exc:  # a refused or reset connection, a timeout
                replies[c].append(Reply(sent, -1, error=f"{type(exc).__name__}: {exc}"))

    threads = [threading.Thread(target=client, args=(c,), daemon=True) for c in range(clients)]
    started = time.monotonic()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout * per_client + 5)
    seconds = time.monotonic() - started
    stuck = [thread.name for thread in threads if thread.is_alive()]
    volley = Volley([reply for own in replies for reply in own], seconds)
    assert not stuck, f"{len(stuck)} client threads never finished; {volley.summary()}"
    return volley


@dataclass
class Ping:
    seconds: float
    in_model: int  # batches inside any model when the server answered
    status: int


def ping_while(port: int, busy: threading.Thread, timeout: float = 5.0, interval: float = 0.02) -> List[Ping]:
    """``GET /ping`` over and over while ``busy`` runs, timing each."""
    pings: List[Ping] = []
    while busy.is_alive():
        try:
            status, body, seconds = get(port, "/ping", timeout)
        except OSError:
            pings.append(Ping(timeout, 0, -1))
            continue
        in_model = sum(body["in_model"].values()) if status == 200 else 0
        pings.append(Ping(seconds, in_model, status))
        time.sleep(interval)
    return pings


#: How long GET /ping may take while a batch is in a model. The /slow model
#: holds its thread 0.6 s; a server whose loop a waiting view blocks answers
#: a ping only once that wait is over, so its slowest ping takes about that
#: long, and the typical one a good part of it. A loaded machine (a load of
#: 8 on 2 cores) delays a ping now and then by a few hundred milliseconds:
#: the slowest ping is held to three quarters of the batch, the typical one
#: (the median) to a sixth, which a blocked loop's is far above
#: (test_control_a_blocking_wait_is_caught).
PING_LIMIT = 0.45
PING_MEDIAN_LIMIT = 0.1


def check_loop_free(port: int, clients: int = 8, limit: float = PING_LIMIT) -> tuple[List[Ping], Volley]:
    """While ``clients`` concurrent POST /slow wait for their slow batches,
    GET /ping keeps answering within ``limit`` seconds, and is seen
    answering while a batch is inside the model."""
    busy, box = in_background(fire, port, "/slow", clients, 1, 30.0, "slow")
    pings = ping_while(port, busy)
    busy.join(60)
    assert "error" not in box, box.get("error")
    volley: Volley = box["result"]
    volley.check_answers()
    assert volley.max_batch() > 1, f"slow requests that arrived during a batch were not batched: {volley.summary()}"
    during = [p for p in pings if p.in_model > 0]
    worst = max((p.seconds for p in pings), default=0.0)
    assert len(during) >= 5, (
        f"only {len(during)} of {len(pings)} pings were answered while a batch was in the model "
        f"(slowest ping {worst:.3f}s): the server answers nothing else while a batch is in flight"
    )
    assert worst < limit, (
        f"a ping took {worst:.3f}s (limit {limit}s) while slow batches were in flight: "
        f"a waiting view blocks the server; pings {[round(p.seconds, 3) for p in pings][:20]}; {volley.summary()}"
    )
    typical = statistics.median(p.seconds for p in pings)
    assert typical < PING_MEDIAN_LIMIT, (
        f"the median ping took {typical:.3f}s (limit {PING_MEDIAN_LIMIT}s) while slow batches were in flight: "
        f"a waiting view blocks the server; pings {[round(p.seconds, 3) for p in pings][:20]}"
    )
    return pings, volley


def in_background(function: Any, *args: Any, **kwargs: Any) -> tuple[threading.Thread, Dict[str, Any]]:
    """Run ``function`` on a thread; its result (or exception) lands in the dict."""
    box: Dict[str, Any] = {}

    def run() -> None:
        try:
            box["result"] = function(*args, **kwargs)
        except BaseException as exc:
            box["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, box


__all__ = [
    "check_loop_free",
    "PING_LIMIT",
    "PING_MEDIAN_LIMIT",
    "live_server",
    "LiveServer",
    "fire",
    "get",
    "post",
    "ping_while",
    "in_background",
    "free_port",
    "flask_dev_argv",
    "gunicorn_argv",
    "gevent_argv",
    "Volley",
    "Reply",
    "Ping",
]
