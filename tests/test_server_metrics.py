"""Several web processes under servers without gunicorn's hooks (uWSGI
``--processes``, uvicorn ``--workers``): with ``PROMETHEUS_MULTIPROC_DIR``
set to an empty directory before the server starts, as the README's
Operations section says, one scrape of ``/metrics`` adds up the calls of
every process, whichever process answers it.

As in ``test_gunicorn_metrics.py``: each call is sent while every other
web process is stopped (SIGSTOP), so the test knows which one served it;
the model answers each input with its process's pid."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Dict, Iterator, List, NamedTuple

import pytest

from tests.helpers import metric_samples, stop_each, wait_for
from tests.servers import child_processes, free_port

pytest.importorskip("prometheus_client")

ROOT = Path(__file__).resolve().parents[1]
#: Calls sent to each web process.
ROUND = 12


class Deployment(NamedTuple):
    argv: List[str]  # the server's command; {port} is the port
    call: str  # POST {"x": n}: answers [n, the serving process's pid]
    metrics: str
    model: str
    env: Dict[str, str]
    loaded: str  # how a web process shows it has loaded the app: "log" (uWSGI's line) or "built" (its model's mark)


def _deployments() -> Dict[str, Deployment]:
    uwsgi = str(Path(sys.executable).with_name("uwsgi"))
    return {
        "flask-uwsgi": Deployment(
            [uwsgi, "--http-socket", "127.0.0.1:{port}", "--module", "tests.flask.warm_app:create_app()",
             "--master", "--processes", "2", "--threads", "4", "--lazy-apps", "--need-app",
             "--disable-logging", "--die-on-term"],
            "/marked", "/metrics", "marked", {"FLASK_STREAMER_METRICS_ROUTE": "/metrics"}, "log",
        ),
        "django-uvicorn": Deployment(
            [sys.executable, "-m", "uvicorn", "tests.django.asgi:application", "--host", "127.0.0.1",
             "--port", "{port}", "--workers", "2", "--log-level", "warning"],
            "/pid", "/ops/metrics", "pid", {"DJANGO_SETTINGS_MODULE": "tests.django.settings"}, "built",
        ),
    }  # fmt: skip


class Server:
    def __init__(self, deployment: Deployment, folder: Path) -> None:
        self.deployment = deployment
        self.port = free_port()
        self.folder = folder
        self.metrics_dir = folder / "prometheus"
        self.metrics_dir.mkdir()
        self.log = folder / "server.log"
        env = {key: value for key, value in os.environ.items() if key.lower() != "prometheus_multiproc_dir"}
        env.update(PYTHONPATH=str(ROOT), PYTHONUNBUFFERED="1", MARK_FOLDER=str(folder),
                   TEST_STREAMER_FOLDER=str(folder), PROMETHEUS_MULTIPROC_DIR=str(self.metrics_dir),
                   **deployment.env)  # fmt: skip
        argv = [part.replace("{port}", str(self.port)) for part in deployment.argv]
        with open(self.log, "wb") as out:
            self.process = subprocess.Popen(
                argv, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def workers(self) -> List[int]:
        """The web processes: the server's children but multiprocessing's
        resource tracker (uvicorn spawns its workers)."""
        return [pid for pid in child_processes(self.process.pid) if b"resource_tracker" not in _cmdline(pid)]

    def call(self, x: int) -> int:
        """POST ``{"x": x}``; the pid of the process that answered."""
        request = urllib.request.Request(
            self.url(self.deployment.call), json.dumps({"x": x}).encode(), {"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(request, timeout=30) as response:
            answer = json.loads(response.read())
        assert answer[0] in (x, {"x": x}), answer  # Django's view takes "x", Flask's route the whole body
        return int(answer[1])

    def loaded(self, pid: int) -> bool:
        """Whether the web process ``pid`` has loaded the app and takes
        requests (uWSGI's ``--lazy-apps`` loads it in each after the fork)."""
        if self.deployment.loaded == "log":
            return re.search(rf"WSGI app 0 .* ready .* pid: {pid}\b", self.log.read_text(errors="replace")) is not None
        return (self.folder / f"built-{pid}").exists()

    def calls_to(self, worker: int) -> set[int]:
        """``ROUND`` calls, 4 at a time, every other web process stopped
        (seen stopped before the first is sent: one still running could
        take a connection): the pids that answered."""
        others = [pid for pid in self.workers() if pid != worker]
        for other in others:
            os.kill(other, signal.SIGSTOP)
        try:
            assert wait_for(lambda: all(_state(pid) == "T" for pid in others), 10), [_state(p) for p in others]
            with ThreadPoolExecutor(4) as pool:
                return set(pool.map(self.call, range(1, ROUND + 1)))
        finally:
            for other in others:
                os.kill(other, signal.SIGCONT)

    def scrape(self) -> Dict[tuple, float]:
        with urllib.request.urlopen(self.url(self.deployment.metrics), timeout=10) as response:
            return metric_samples(response.read().decode())

    def text(self) -> str:
        return self.log.read_text(errors="replace")[-3000:]


def _state(pid: int) -> str:
    """The process's state letter (``T``: stopped), from /proc."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return "?"


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


@pytest.fixture
def serve(tmp_path: Path) -> Iterator:
    started: List[Server] = []

    def serve(name: str) -> Server:
        server = Server(_deployments()[name], tmp_path)
        started.append(server)
        return server

    yield serve
    stop_each(server.process for server in started)


@pytest.mark.parametrize("name", ["flask-uwsgi", "django-uvicorn"])
def test_several_web_processes_add_up_with_the_directory_set_by_hand(serve, name: str) -> None:
    server = serve(name)

    def ready() -> bool:
        workers = server.workers()
        if len(workers) != 2 or not all(server.loaded(pid) for pid in workers):
            return False
        try:
            urllib.request.urlopen(server.url(server.deployment.metrics), timeout=5).close()
        except OSError:
            return False
        return True

    assert wait_for(ready, 60, interval=0.2), server.text()
    workers = server.workers()
    for worker in workers:
        assert server.calls_to(worker) == {worker}, server.text()
    model = ("model", server.deployment.model)
    for _ in range(4):  # whichever process answers the scrape
        found = server.scrape()
        assert found[("streamer_requests_total", (model, ("outcome", "ok")))] == ROUND * 2, found
        assert found[("streamer_queue_wait_seconds_count", (model,))] == ROUND * 2
    assert sorted(path.name for path in server.metrics_dir.iterdir()), "nothing written to the directory"
