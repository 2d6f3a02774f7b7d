"""The examples' ``gunicorn.conf.py`` with several workers: ``/metrics``
adds up every worker's calls by itself, with no setting (issue #43: under
the README's ``-w 4`` recipe a scrape showed the one process that answered
it, 608 of some 2,460 calls).

Each test runs real gunicorn on 127.0.0.1 with an example's config and a
test app whose model answers at once with its process id (the examples'
own models take seconds to load), so the test knows which worker served
each call. The hooks it checks are the config's: ``on_starting`` (a fresh
``PROMETHEUS_MULTIPROC_DIR`` before the first fork), ``child_exit`` and
``on_exit`` (the directory removed as gunicorn stops)."""

from __future__ import annotations

import functools
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Dict, Iterator, List, NamedTuple, Optional, Set, Tuple

import pytest

from tests.helpers import beating_workers, metric_samples, stop_all, stop_each, wait_for
from tests.servers import RedisServer, child_processes, free_port, kill_group

pytest.importorskip("prometheus_client")
pytest.importorskip("gunicorn")

ROOT = Path(__file__).resolve().parents[1]
#: Calls sent to each worker.
ROUND = 20


class Framework(NamedTuple):
    config: str
    app: str
    call: str  # POST {"x": n}: answers [n, the serving process's pid]
    metrics: str
    model: str
    env: Dict[str, str]


FRAMEWORKS = {
    "flask": Framework(
        "example_flask/gunicorn.conf.py",
        "tests.flask.warm_app:create_app()",
        "/marked",
        "/metrics",
        "marked",
        {"FLASK_STREAMER_METRICS_ROUTE": "/metrics"},
    ),
    "django": Framework(
        "example_django/gunicorn.conf.py",
        "tests.django.wsgi:application",
        "/pid",
        "/ops/metrics",
        "pid",
        {"DJANGO_SETTINGS_MODULE": "tests.django.settings"},
    ),
}


class Gunicorn:
    """gunicorn with an example's config, in a process group of its own."""

    def __init__(self, framework: Framework, workers: int, folder: Path, config: Optional[str] = None) -> None:
        self.port = free_port()
        self.log = folder / "gunicorn.log"
        argv = [sys.executable, "-m", "gunicorn", "-c", config or framework.config, "-w", str(workers),
                "--bind", f"127.0.0.1:{self.port}", "--graceful-timeout", "5", framework.app]  # fmt: skip
        env = {key: value for key, value in os.environ.items() if key.lower() != "prometheus_multiproc_dir"}
        env.update(PYTHONPATH=str(ROOT), PYTHONUNBUFFERED="1", PIN_WORKERS="0", MARK_FOLDER=str(folder),
                   TEST_STREAMER_FOLDER=str(folder), TMPDIR=str(folder), **framework.env)  # fmt: skip
        with open(self.log, "wb") as out:
            self.process = subprocess.Popen(
                argv, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def call(self, path: str, x: int) -> int:
        """POST ``{"x": x}``; the pid of the process that answered."""
        body = json.dumps({"x": x}).encode()
        request = urllib.request.Request(self.url(path), body, {"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=10) as response:
            answer = json.loads(response.read())
        assert answer[0] in (x, {"x": x}), answer  # Django's view takes "x", Flask's route the whole body
        return int(answer[1])

    def workers(self) -> List[int]:
        return child_processes(self.process.pid)

    def text(self) -> str:
        return self.log.read_text(errors="replace")[-3000:]

    def stop(self) -> None:
        """SIGTERM, as a deployment stops it: the master runs ``on_exit``."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(20)
            except subprocess.TimeoutExpired:
                pass
        kill_group(self.process)


def _made(folder: Path) -> List[Path]:
    """The multiprocess directories the config made (gunicorn runs with
    ``TMPDIR=folder``)."""
    return sorted(folder.glob("streamer-prometheus-*"))


@pytest.fixture
def start(tmp_path: Path) -> Iterator:
    started: List[Gunicorn] = []

    def start(name: str | Framework, workers: int, config: Optional[str] = None) -> Gunicorn:
        server = Gunicorn(FRAMEWORKS[name] if isinstance(name, str) else name, workers, tmp_path, config)
        started.append(server)
        return server

    yield start
    stop_all(server.stop for server in started)


def _ready(server: Gunicorn, framework: Framework, workers: int, folder: Path) -> bool:
    """Every worker has loaded its models and the server answers a GET of
    ``/metrics`` (which counts no call)."""
    if len(server.workers()) != workers or len(list(folder.glob("built-*"))) < workers:
        return False
    try:
        urllib.request.urlopen(server.url(framework.metrics), timeout=5).close()
    except OSError:
        return False
    return True


def _calls_to(server: Gunicorn, framework: Framework, worker: int, others: List[int]) -> Set[int]:
    """``ROUND`` calls, 8 at a time, while every other worker is stopped
    (SIGSTOP): ``worker`` accepts them all. The pids that answered."""
    for other in others:
        os.kill(other, signal.SIGSTOP)
    try:
        with ThreadPoolExecutor(8) as pool:
            return set(pool.map(lambda x: server.call(framework.call, x), range(1, ROUND + 1)))
    finally:
        for other in others:
            os.kill(other, signal.SIGCONT)


def _scrape_from(server: Gunicorn, path: str, worker: int, others: List[int]) -> str:
    """``/metrics`` as ``worker`` answers it, every other worker stopped (SIGSTOP)."""
    for other in others:
        os.kill(other, signal.SIGSTOP)
    try:
        with urllib.request.urlopen(server.url(path), timeout=10) as response:
            return str(response.read().decode())
    finally:
        for other in others:
            os.kill(other, signal.SIGCONT)


def _live_once(
    server: Gunicorn, path: str, worker: int, others: List[int], expected: Dict[str, Tuple[float, Dict[str, float]]]
) -> Dict[str, Tuple[float, Dict[str, float]]]:
    """The live workers as ``worker`` answers the scrape, once they read
    ``expected`` or 5 s have passed (each process writes its own workers to
    the files once a second, ``GAUGE_PERIOD_S``); the last read."""
    last: Dict[str, Tuple[float, Dict[str, float]]] = {}
    for _ in range(50):
        last = _live_workers(_scrape_from(server, path, worker, others))
        if last == expected:
            break
        time.sleep(0.1)
    return last


def _doubled(server: Gunicorn, x: int) -> Optional[int]:
    """``/remote``'s answer to ``x`` (the Redis workers double it); ``None`` when refused."""
    body = json.dumps(x).encode()
    request = urllib.request.Request(server.url("/remote"), body, {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return int(json.loads(response.read()))
    except urllib.error.HTTPError:
        return None


def _live_workers(text: str) -> Dict[str, Tuple[float, Dict[str, float]]]:
    """Each model's ``streamer_workers_live`` and its ``..._by_device`` samples,
    from an exposition that must hold each family once."""
    from prometheus_client.parser import text_string_to_metric_families

    families = [family.name for family in text_string_to_metric_families(text)]
    assert len(families) == len(set(families)), sorted(families)
    found: Dict[str, Tuple[float, Dict[str, float]]] = {}
    for (name, labels), value in metric_samples(text).items():
        label = dict(labels)
        live, devices = found.setdefault(label.get("model", ""), (0.0, {}))
        if name == "streamer_workers_live":
            found[label["model"]] = (value, devices)
        elif name == "streamer_workers_live_by_device":
            devices[label["device"]] = value
    return found


def test_redis_workers_count_once_whichever_web_process_answers_and_thread_workers_add_up(
    start, tmp_path: Path
) -> None:
    """Two web processes serving a thread-backend model (a worker each) and a
    Redis-backend model (three workers elsewhere, on devices 0, 1, 0): each
    web process's scrape says 2 and 3 live workers, by device too, with each
    family once; the Redis ones are asked of Redis by the process that
    answers, not added up over the processes (which read 6). With Redis
    stopped, the Redis model's live workers read 0 and have no device
    sample, and the thread-backend model's are still right."""
    folder = tmp_path / "redis"
    folder.mkdir()
    redis_server = RedisServer(folder)
    prefix = f"mixed-{os.getpid()}-{free_port()}"
    env = {key: value for key, value in os.environ.items() if key.lower() != "prometheus_multiproc_dir"}
    env.pop("CUDA_VISIBLE_DEVICES", None)
    env.update(PYTHONPATH=str(ROOT), PYTHONUNBUFFERED="1")
    log = tmp_path / "workers.log"
    started: List[subprocess.Popen] = []
    try:
        redis_server.start()
        with open(log, "wb") as out:
            started.append(subprocess.Popen(
                [sys.executable, "-m", "streamer_core.cli", "tests.redis.models:double", "--workers", "3",
                 "--devices", "0,1", "--prefix", prefix, "--redis", redis_server.url],
                cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
            ))  # fmt: skip
        framework = Framework(
            "example_flask/gunicorn.conf.py", "tests.flask.mixed_app:create_app()", "/marked", "/metrics", "marked",
            {"FLASK_STREAMER_METRICS_ROUTE": "/metrics", "MIXED_REDIS_URL": redis_server.url, "MIXED_PREFIX": prefix},
        )  # fmt: skip
        server = start(framework, 2)
        assert wait_for(lambda: _ready(server, framework, 2, tmp_path), 60), server.text()
        assert wait_for(lambda: beating_workers(redis_server.url, prefix) == 3, 60), log.read_text()
        # Each web process checks Redis for workers once a second: until it has seen them, calls are refused.
        assert wait_for(lambda: _doubled(server, 21) == 42, 10), server.text()
        web = server.workers()
        assert len(web) == 2
        both = {"remote": (3, {"0": 2, "1": 1}), "marked": (2, {"default": 2})}
        for worker in web:
            live = _live_once(server, framework.metrics, worker, [w for w in web if w != worker], both)
            assert live == both, (worker, live)

        redis_server.kill()
        for worker in web:
            text = _scrape_from(server, framework.metrics, worker, [w for w in web if w != worker])
            live = _live_workers(text)
            assert live == {"remote": (0, {}), "marked": (2, {"default": 2})}, (worker, live)
            assert 'streamer_redis_pending{model="remote"}' not in text
    finally:
        stop_all([functools.partial(stop_each, started), redis_server.kill])


_USERS_DIR = """
import os, sys
from types import SimpleNamespace
from streamer_core.web import gunicorn
os.environ["PROMETHEUS_MULTIPROC_DIR"] = sys.argv[1]
server = SimpleNamespace(cfg=SimpleNamespace(workers=4))
gunicorn.on_starting(server)
gunicorn.on_exit(server)
print(os.environ["PROMETHEUS_MULTIPROC_DIR"], os.path.isdir(sys.argv[1]), gunicorn._own_dir)
"""


def test_a_directory_the_user_set_is_used_as_it_is_and_kept(tmp_path: Path) -> None:
    """``PROMETHEUS_MULTIPROC_DIR`` set before gunicorn starts is the user's:
    the hooks neither replace it nor remove it (a fresh interpreter:
    prometheus_client not imported, as in gunicorn's master)."""
    mine = tmp_path / "mine"
    mine.mkdir()
    done = subprocess.run([sys.executable, "-c", _USERS_DIR, str(mine)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [str(mine), "True", "None"]


@pytest.mark.parametrize("name", sorted(FRAMEWORKS))
def test_two_workers_metrics_add_up_with_the_examples_config_alone(start, tmp_path: Path, name: str) -> None:
    """Two workers and no PROMETHEUS_MULTIPROC_DIR given: ``ROUND`` calls
    served by each, and one scrape counts all of them, whichever worker
    answers it; the directory the config made is gone once gunicorn has
    stopped."""
    framework = FRAMEWORKS[name]
    server = start(name, 2)
    assert wait_for(lambda: _ready(server, framework, 2, tmp_path), 60), server.text()
    workers = server.workers()
    for worker in workers:
        served = _calls_to(server, framework, worker, [other for other in workers if other != worker])
        assert served == {worker}, (served, worker)
    sent = ROUND * len(workers)

    with urllib.request.urlopen(server.url(framework.metrics), timeout=10) as response:
        found = metric_samples(response.read().decode())
    model = ("model", framework.model)
    assert found[("streamer_requests_total", (model, ("outcome", "ok")))] == sent
    assert found[("streamer_queue_wait_seconds_count", (model,))] == sent

    [folder] = _made(tmp_path)
    server.stop()
    assert server.process.returncode == 0, server.text()
    assert not folder.exists(), "on_exit should have removed the directory it made"


def test_a_killed_workers_gauges_leave_the_sums(start, tmp_path: Path) -> None:
    """Two web processes on the thread backend, a model worker each: 2 live
    workers. One is killed (the OOM killer, say) and gunicorn starts
    another in its place: the scrape says 2 again, not 3 (child_exit marks
    the dead process's gauge files dead, so livesum leaves it out)."""
    framework = FRAMEWORKS["flask"]
    server = start("flask", 2)
    assert wait_for(lambda: _ready(server, framework, 2, tmp_path), 60), server.text()
    victim, survivor = server.workers()

    def live() -> object:
        with urllib.request.urlopen(server.url(framework.metrics), timeout=10) as response:
            return _live_workers(response.read().decode()).get(framework.model)

    assert wait_for(lambda: live() == (2, {"default": 2}), 10), live()
    os.kill(victim, signal.SIGKILL)

    def replaced() -> bool:
        workers = server.workers()
        return len(workers) == 2 and victim not in workers

    assert wait_for(replaced, 60), server.text()
    [new] = [pid for pid in server.workers() if pid != survivor]
    assert wait_for(lambda: (tmp_path / f"built-{new}").exists(), 60), server.text()
    time.sleep(2)  # each process writes its gauges once a second
    assert wait_for(lambda: live() == (2, {"default": 2}), 10), live()


def test_one_worker_keeps_the_one_process_registry(start, tmp_path: Path) -> None:
    """With one worker nothing is set: its registry is the default one,
    process metrics and all."""
    server = start("flask", 1)
    framework = FRAMEWORKS["flask"]
    assert wait_for(lambda: _ready(server, framework, 1, tmp_path), 60), server.text()
    assert _made(tmp_path) == []
    server.call(framework.call, 1)
    with urllib.request.urlopen(server.url(framework.metrics), timeout=10) as response:
        text = response.read().decode()
    assert "process_cpu_seconds_total" in text
    found = metric_samples(text)
    assert found[("streamer_requests_total", (("model", "marked"), ("outcome", "ok")))] == 1


def test_prometheus_client_imported_before_the_fork_sets_nothing_and_says_so(start, tmp_path: Path) -> None:
    """prometheus_client reads the variable when it is first imported: a
    config that imports it first would leave the workers writing nowhere.
    Nothing is set then, each worker counts its own calls, and the log
    says how to add them up."""
    conf = tmp_path / "gunicorn.conf.py"
    conf.write_text(
        "import prometheus_client  # noqa: F401\n"
        "from flask_streamer.gunicorn import child_exit, on_exit, on_starting, post_worker_init, pre_fork\n"
    )
    server = start("flask", 2, config=str(conf))
    framework = FRAMEWORKS["flask"]
    assert wait_for(lambda: _ready(server, framework, 2, tmp_path), 60), server.text()
    assert _made(tmp_path) == []
    assert "set PROMETHEUS_MULTIPROC_DIR" in server.text()
    server.call(framework.call, 1)
    with urllib.request.urlopen(server.url(framework.metrics), timeout=10) as response:
        assert "process_cpu_seconds_total" in response.read().decode()  # each worker's own registry


_MASTER = """
import os, sys
from types import SimpleNamespace
from streamer_core.web import gunicorn
if sys.argv[1] != "-":
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = sys.argv[1]
server = SimpleNamespace(cfg=SimpleNamespace(workers=int(sys.argv[2])))
gunicorn.on_starting(server)
print("prometheus_client.multiprocess" in sys.modules)
gunicorn.on_exit(server)
"""


@pytest.mark.parametrize(("directory", "workers", "imported"), [("-", 4, True), ("mine", 4, True), ("-", 1, False)])
def test_the_master_imports_the_multiprocess_module_before_a_worker_can_exit(
    tmp_path: Path, directory: str, workers: int, imported: bool
) -> None:
    """With a multiprocess directory (set by the hook, or the user's), the
    master imports prometheus_client's multiprocess module as it starts:
    gunicorn before 26 calls ``child_exit`` from its SIGCHLD handler, where
    an import is re-entered by the next worker's exit and fails half done.
    With one worker and no directory, it imports nothing."""
    argument = str(tmp_path) if directory == "mine" else "-"
    done = subprocess.run(
        [sys.executable, "-c", _MASTER, argument, str(workers)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [str(imported)]
