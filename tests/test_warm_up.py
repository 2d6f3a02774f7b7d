"""The documented way to load the models as a server process boots, not on
its first request: the examples' ``gunicorn.conf.py`` (``post_worker_init``
calls ``start_streamers``), for Flask and Django, and ``start_streamers()``
at the end of ``asgi.py`` under uvicorn. Each server runs for real on
127.0.0.1; the model marks its loading with a file named by its pid, so the
test sees it loaded before any request is sent, in the process that then
answers."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Dict, Iterator, List, Optional

import pytest

from tests.helpers import stop_all, wait_for
from tests.servers import free_port, kill_group

ROOT = Path(__file__).resolve().parents[1]


class Server:
    """``python -m <args>`` (or the program ``argv``) on 127.0.0.1, in a
    process group of its own, killed whole by :meth:`stop`."""

    def __init__(self, args: List[str], env: Dict[str, str], log: Path, argv: Optional[List[str]] = None) -> None:
        self.log_path = log
        with open(log, "wb") as out:
            self.process = subprocess.Popen(
                argv or [sys.executable, "-m", *args],
                cwd=ROOT,
                env={**os.environ, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1", **env},
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self) -> None:
        kill_group(self.process)


@pytest.fixture
def servers(tmp_path: Path) -> Iterator:
    started: List[Server] = []

    def start(*args: str, **env: str) -> Server:
        server = Server(list(args), env, tmp_path / f"server-{len(started)}.log")
        started.append(server)
        return server

    yield start
    stop_all(server.stop for server in started)


def _post(url: str, data: dict) -> object:
    request = urllib.request.Request(url, json.dumps(data).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.loads(response.read())


def _marks(folder: Path) -> List[int]:
    return sorted(int(path.name.split("-")[1]) for path in folder.glob("built-*"))


def _loaded_at_boot(server: Server, folder: Path, url: str, answer_pid) -> None:
    """The model loads with no request sent; the first request is answered
    by the process that loaded it."""
    assert wait_for(lambda: _marks(folder), 60), f"the model did not load as the server booted:\n{server.log()[-2000:]}"
    [pid] = _marks(folder)
    assert server.process.poll() is None
    host, port = url.split("/")[2].split(":")
    assert wait_for(lambda: _listening(host, int(port)), 30), server.log()[-2000:]
    answer = _post(url, {"x": 5})
    assert answer_pid(answer) == pid, f"answered by {answer}, loaded in {pid}"
    assert _marks(folder) == [pid], "the request should not have built the model again"


def test_gunicorn_loads_a_flask_apps_models_as_it_boots(servers, tmp_path):
    port = free_port()
    server = servers(
        "gunicorn", "-c", "example_flask/gunicorn.conf.py", "--bind", f"127.0.0.1:{port}",
        "tests.flask.warm_app:create_app()", MARK_FOLDER=str(tmp_path),
    )  # fmt: skip
    _loaded_at_boot(server, tmp_path, f"http://127.0.0.1:{port}/marked", lambda answer: answer[1])


@pytest.mark.parametrize("framework", ["flask", "django"])
def test_a_projects_own_gunicorn_conf_gets_the_deployment_policy_in_one_line(servers, tmp_path, framework):
    """A config of its own that imports the layer's hooks: its models load
    as each process boots, then the process is pinned to a core of its own
    (PIN_WORKERS=1 here) and what loading made is frozen, the collector's
    first threshold raised (streamer_core.web.gunicorn)."""
    conf = tmp_path / "gunicorn.conf.py"
    conf.write_text(f"from {framework}_streamer.gunicorn import child_exit, post_worker_init, pre_fork  # noqa: F401\n")
    port = free_port()
    app = "tests.flask.warm_app:create_app()" if framework == "flask" else "tests.django.wsgi:application"
    server = servers(
        "gunicorn", "-c", str(conf), "-w", "2", "--bind", f"127.0.0.1:{port}", app,
        MARK_FOLDER=str(tmp_path), TEST_STREAMER_FOLDER=str(tmp_path), PIN_WORKERS="1", **DJANGO_ENV,
    )  # fmt: skip
    assert wait_for(lambda: len(_marks(tmp_path)) == 2, 90), f"each process loads its model:\n{server.log()[-2000:]}"
    assert wait_for(lambda: _listening("127.0.0.1", port), 30), server.log()[-2000:]
    seen = {}
    deadline = time.monotonic() + 30
    while len(seen) < 2 and time.monotonic() < deadline:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/process", timeout=10) as response:
            answer = json.loads(response.read())
        seen[tuple(answer["cores"])] = answer
    assert all(answer["frozen"] > 10_000 and answer["threshold"][0] == 10_000 for answer in seen.values()), seen
    cores = sorted(seen)
    assert len(cores) == 2 and all(len(each) == 1 for each in cores) and cores[0] != cores[1], cores


def test_control_without_the_hook_a_flask_model_loads_on_its_first_request(servers, tmp_path):
    port = free_port()
    servers(
        "gunicorn", "--bind", f"127.0.0.1:{port}", "--threads", "4", "tests.flask.warm_app:create_app()",
        MARK_FOLDER=str(tmp_path),
    )  # fmt: skip
    assert wait_for(lambda: _answers(f"http://127.0.0.1:{port}/nothing"), 30)
    time.sleep(0.5)
    assert _marks(tmp_path) == [], "without the hook nothing loads before a request"
    _post(f"http://127.0.0.1:{port}/marked", {"x": 1})
    assert len(_marks(tmp_path)) == 1


def _ready(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return bool(response.status == 200)
    except OSError:
        return False


def _listening(host: str, port: int) -> bool:
    try:
        socket.create_connection((host, port), timeout=1).close()
    except OSError:
        return False
    return True


def _answers(url: str) -> bool:
    try:
        urllib.request.urlopen(url, timeout=2)
    except urllib.error.HTTPError:
        return True  # the server is up (a 404 is an answer)
    except OSError:
        return False
    return True


DJANGO_ENV = {"DJANGO_SETTINGS_MODULE": "tests.django.settings"}


def test_gunicorn_loads_a_django_projects_models_as_it_boots(servers, tmp_path):
    port = free_port()
    server = servers(
        "gunicorn", "-c", "example_django/gunicorn.conf.py", "--bind", f"127.0.0.1:{port}",
        "django.core.wsgi:get_wsgi_application()", TEST_STREAMER_FOLDER=str(tmp_path), **DJANGO_ENV,
    )  # fmt: skip
    _loaded_at_boot(server, tmp_path, f"http://127.0.0.1:{port}/pid", lambda answer: answer[1])


def test_uvicorn_loads_a_django_projects_models_as_it_boots(servers, tmp_path):
    port = free_port()
    server = servers(
        "uvicorn", "tests.django.asgi:application", "--host", "127.0.0.1", "--port", str(port), "--log-level",
        "warning", TEST_STREAMER_FOLDER=str(tmp_path), **DJANGO_ENV,
    )  # fmt: skip
    _loaded_at_boot(server, tmp_path, f"http://127.0.0.1:{port}/pid", lambda answer: answer[1])


def test_uwsgi_with_lazy_apps_loads_the_models_as_each_worker_imports_the_app(servers, tmp_path):
    port = free_port()
    uwsgi = str(Path(sys.executable).with_name("uwsgi"))
    server = Server(
        [], {"MARK_FOLDER": str(tmp_path)}, tmp_path / "uwsgi.log",
        argv=[uwsgi, "--http-socket", f"127.0.0.1:{port}", "--module", "tests.flask.warm_wsgi:app", "--master",
              "--processes", "1", "--threads", "8", "--lazy-apps", "--die-on-term", "--disable-logging"],
    )  # fmt: skip
    try:
        assert wait_for(lambda: _marks(tmp_path), 60), server.log()[-2000:]
        [pid] = _marks(tmp_path)
        assert pid != server.process.pid, "the master must not load the model: only the worker serves"
        _loaded_at_boot(server, tmp_path, f"http://127.0.0.1:{port}/marked", lambda answer: answer[1])
    finally:
        server.stop()


# -- streamers started before a fork ---------------------------------------------------------


def _answered_by_workers(server: Server, url: str, answer_pid, calls: int = 24) -> set:
    host, port = url.split("/")[2].split(":")
    assert wait_for(lambda: _listening(host, int(port)), 30), server.log()[-2000:]
    pids = set()
    for x in range(calls):
        pids.add(answer_pid(_post(url, {"x": x})))
    return pids


def test_gunicorn_preload_with_a_flask_streamer_started_in_the_master(servers, tmp_path):
    """``--preload`` imports the app in the master, which here starts its
    streamer (a warm-up in the wrong place); the forked workers must each
    start their own rather than use the master's, whose threads they lack."""
    port = free_port()
    server = servers(
        "gunicorn", "--preload", "-w", "2", "--threads", "8", "--bind", f"127.0.0.1:{port}",
        "tests.flask.warm_wsgi:app", MARK_FOLDER=str(tmp_path), FLASK_STREAMER_TIMEOUT="5",
    )  # fmt: skip
    pids = _answered_by_workers(server, f"http://127.0.0.1:{port}/marked", lambda answer: answer[1])
    assert server.process.pid in _marks(tmp_path), "the master started a streamer before forking"
    assert server.process.pid not in pids and pids <= set(_marks(tmp_path))


def test_gunicorn_preload_with_django_streamers_started_in_the_master(servers, tmp_path):
    port = free_port()
    server = servers(
        "gunicorn", "--preload", "-w", "2", "--threads", "8", "--bind", f"127.0.0.1:{port}",
        "tests.django.wsgi_started:application", TEST_STREAMER_FOLDER=str(tmp_path), **DJANGO_ENV,
    )  # fmt: skip
    pids = _answered_by_workers(server, f"http://127.0.0.1:{port}/pid", lambda answer: answer[1])
    assert server.process.pid in _marks(tmp_path), "the master started the streamers before forking"
    assert pids and server.process.pid not in pids, f"answered by {pids}, the master is {server.process.pid}"


def test_the_django_hooks_import_nothing_of_django():
    """gunicorn's master reads the config, importing the hooks, before the
    project's wsgi.py names its settings module: were django.conf's lazy
    settings made then, gevent's patching in each worker would touch them
    and the worker die (ImproperlyConfigured) as it boots."""
    script = "import sys, django_streamer.gunicorn; print(sorted(m for m in sys.modules if m.startswith('django.')))"
    env = {key: value for key, value in os.environ.items() if key != "DJANGO_SETTINGS_MODULE"}
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, env={**env, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True
    )
    assert done.returncode == 0 and done.stdout.strip() == "[]", done.stdout + done.stderr


def test_ctrl_c_stops_the_examples_gevent_gunicorn_without_a_traceback(servers, tmp_path):
    """Ctrl-C signals every process of the terminal: the worker quits on its
    SIGINT, then its master's SIGQUIT arrives while Python shuts down. Quit
    once (``streamer_core.web.gunicorn.quit_once``), not a ``SystemExit: 0``
    traceback."""
    port = free_port()
    server = servers(
        "gunicorn", "-c", "example_flask/gunicorn.conf.py", "--bind", f"127.0.0.1:{port}",
        "tests.flask.warm_app:create_app()", MARK_FOLDER=str(tmp_path),
    )  # fmt: skip
    assert wait_for(lambda: _marks(tmp_path), 60), server.log()[-2000:]
    assert wait_for(lambda: _listening("127.0.0.1", port), 30), server.log()[-2000:]
    _post(f"http://127.0.0.1:{port}/marked", {"x": 1})
    os.killpg(server.process.pid, signal.SIGINT)  # what a terminal's Ctrl-C does
    assert server.process.wait(30) == 0, server.log()[-3000:]
    log = server.log()
    assert "Shutting down: Master" in log and "Traceback" not in log and "SystemExit" not in log, log[-3000:]


def test_sigterm_stops_the_flask_example_under_its_gevent_gunicorn_without_a_traceback(servers):
    """The example itself (its loggers, its models), served as deployed:
    SIGTERM to gunicorn's master, as a service manager sends it, ends every
    worker quietly. A handler of the example's on the Flask app's parent
    logger once left Flask's default handler to be collected after gevent's
    thread module, an ``Exception ignored`` traceback at every exit."""
    port = free_port()
    server = servers(
        "gunicorn", "-c", "example_flask/gunicorn.conf.py", "--bind", f"127.0.0.1:{port}", "example_flask:create_app()",
        FLASK_EMBEDDING_PRECISION="float32", PIN_WORKERS="0",
    )  # fmt: skip
    assert wait_for(lambda: _ready(f"http://127.0.0.1:{port}/readyz"), 120), server.log()[-2000:]
    assert len(_post(f"http://127.0.0.1:{port}/stream", {"s": "It rains."})) == 384  # type: ignore[arg-type]
    os.kill(server.process.pid, signal.SIGTERM)
    assert server.process.wait(30) == 0, server.log()[-3000:]
    log = server.log()
    assert "Shutting down: Master" in log, log[-3000:]
    assert "Traceback" not in log and "Exception ignored" not in log, log[-3000:]


def test_sigterm_stops_the_flask_dev_server_on_the_process_backend_cleanly(servers, tmp_path):
    """SIGTERM to the example's dev server (every process of its group, as a
    service manager sends it): the streamers close, nothing is left to the
    resource tracker to call leaked, no process is left behind."""
    port = free_port()
    server = servers("example_flask", PORT=str(port), FLASK_STREAMER_BACKEND="process")
    assert wait_for(lambda: _listening("127.0.0.1", port), 120), server.log()[-2000:]
    assert len(_post(f"http://127.0.0.1:{port}/stream", {"s": "It rains."})) == 384
    os.killpg(server.process.pid, signal.SIGTERM)
    assert server.process.wait(30) == 0, server.log()[-3000:]
    time.sleep(1)  # the resource tracker warns as it ends, after the server
    log = server.log()
    assert "leaked" not in log and "Traceback" not in log, log[-3000:]
    assert wait_for(lambda: not _group_alive(server.process.pid), 10), "a process of the server outlived it"


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True
