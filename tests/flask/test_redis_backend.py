"""The Redis backend behind Flask: the web process only enqueues, and
``flask --app ... streamer run-workers`` (a real subprocess) runs the workers
of every batched route of the app, or of the routes picked with ``--route``,
until SIGTERM.

Each test has its own STREAMER_PREFIX on the session's Redis and deletes
its keys at the end (never FLUSHALL); every program it starts is killed,
process group and all."""

from __future__ import annotations

import functools
import os
import pickle
import signal
import subprocess
import sys
import threading
import uuid
from pathlib import Path
from typing import Any, Callable, Iterator, List

import pytest
import redis
from flask import Flask

from tests.flask.apps import create_redis_app
from tests.flask.conftest import close_streamers, error_of
from tests.flask.live import in_background
from tests.helpers import alive, beating_workers, stop_all, stop_each, wait_for
from tests.redis.models import Evil
from tests.servers import delete_prefix, worker_children

ROOT = Path(__file__).resolve().parents[2]
APP = "tests.flask.apps:create_redis_app()"


class Cli:
    """One ``flask ... streamer run-workers`` program and its output."""

    def __init__(self, process: subprocess.Popen, log: Path) -> None:
        self.process = process
        self.log_path = log

    @property
    def pid(self) -> int:
        return self.process.pid

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def workers(self) -> List[int]:
        return worker_children(self.pid)


@pytest.fixture
def prefix(redis_url: str) -> Iterator[str]:
    """A STREAMER_PREFIX of this test's own; its keys are deleted at the end."""
    name = f"flask-test-{uuid.uuid4().hex[:10]}"
    yield name
    delete_prefix(redis_url, name)


@pytest.fixture
def run_workers(tmp_path: Path, redis_url: str, prefix: str) -> Iterator[Callable[..., Cli]]:
    """``run_workers(*options, app=APP)``: start ``flask --app <app> streamer
    run-workers <options>`` with the test's Redis URL and prefix in its
    environment (``FLASK_STREAMER_*``, read by ``from_prefixed_env``)."""
    started: List[Cli] = []

    def start(*options: str, app: str = APP) -> Cli:
        env = {
            **os.environ,
            "PYTHONPATH": str(ROOT),
            "PYTHONUNBUFFERED": "1",
            "FLASK_STREAMER_REDIS_URL": redis_url,
            "FLASK_STREAMER_PREFIX": prefix,
        }
        env.pop("CUDA_VISIBLE_DEVICES", None)
        env.pop("FLASK_APP", None)
        log = tmp_path / f"run-workers-{len(started)}.log"
        with open(log, "wb") as out:
            process = subprocess.Popen(
                [sys.executable, "-m", "flask", "--app", app, "streamer", "run-workers", *options],
                cwd=ROOT,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        cli = Cli(process, log)
        started.append(cli)
        return cli

    yield start
    stop_each(cli.process for cli in started)


@pytest.fixture
def web(redis_url: str, prefix: str) -> Iterator[Callable[..., Flask]]:
    """``web(**config)``: the app as a web process makes it, on the test's
    Redis and prefix; its streamers are closed at the end."""
    made: List[Flask] = []

    def make(**config: Any) -> Flask:
        app = create_redis_app({"STREAMER_REDIS_URL": redis_url, "STREAMER_PREFIX": prefix, **config})
        made.append(app)
        return app

    yield make
    stop_all(functools.partial(close_streamers, app) for app in made)


def requests_key(prefix: str, route: str) -> str:
    return f"streamer:{prefix}:{route}:requests"


def until_served(app: Flask, path: str, body: Any, seconds: float = 30.0) -> Any:
    """POST until the answer is not "no worker yet" (503), for up to ``seconds``."""
    client = app.test_client()
    response = wait_for(
        lambda: (lambda r: r if r.status_code != 503 else None)(client.post(path, json=body)), seconds, 0.1
    )
    assert response is not None, f"{path} still had no worker after {seconds}s"
    return response


def test_the_web_process_enqueues_and_the_cli_workers_answer(web, run_workers, redis_url, prefix):
    app = web()
    conn = redis.Redis.from_url(redis_url, socket_timeout=5)
    threads_before = set(threading.enumerate())
    try:
        # No worker yet: a 503 at once, saying so, and nothing left in Redis
        # or running the model here.
        assert wait_for(lambda: app.test_client().post("/double", json=21).status_code == 503, 5)
        response = app.test_client().post("/double", json=21)
        error = error_of(response, 503)
        assert error["type"] == "NoWorkerError" and "start workers" in error["message"], error
        assert response.headers["Retry-After"] == "5"
        assert conn.xlen(requests_key(prefix, "double")) == 0
        assert worker_children(os.getpid()) == [], "the web process must not start workers"
        assert not any(t.name == "streamer-thread-model" for t in set(threading.enumerate()) - threads_before)

        cli = run_workers()
        early = until_served(app, "/double", 21)
        assert early.status_code == 200 and early.get_json() == 42, cli.log()
    finally:
        conn.close()

    # Each route has a worker of its own: wait until each is up.
    assert until_served(app, "/sized", "s").get_json() == {"x": "s", "n": 1}
    until_served(app, "/boom", "fine")
    client = app.test_client()
    error = error_of(client.post("/boom", json="boom"), 500)
    assert (error["type"], error["message"]) == ("internal_error", "internal error")  # the worker's error is logged
    assert client.post("/boom", json="fine").get_json() == "ok:fine"

    # One worker per batched route, each listed with its keys.
    assert len(cli.workers()) == 3, cli.log()
    for route in ("double", "sized", "boom"):
        assert f"{route}: 1 worker(s) on {redis_url} (keys streamer:{prefix}:{route}:*)" in cli.log()

    # SIGTERM: the workers finish and the command exits 0, soon.
    workers = cli.workers()
    cli.process.send_signal(signal.SIGTERM)
    assert cli.process.wait(20) == 0, cli.log()
    assert wait_for(lambda: not any(alive(pid) for pid in workers), 5), "workers outlived the command"


def test_route_picks_the_routes_and_workers_and_devices_are_options(web, run_workers, redis_url, prefix):
    cli = run_workers("--route", "double", "--workers", "2", "--devices", "0,1")
    app = web()
    assert until_served(app, "/double", "ab").get_json() == "abab", cli.log()
    assert wait_for(lambda: len(cli.workers()) == 2, 10), cli.log()
    log = cli.log()
    assert f"double: 2 worker(s) on {redis_url}" in log and "sized:" not in log and "boom:" not in log
    assert "double worker 0 (pid" in log and "started on device 0" in log
    assert "double worker 1 (pid" in log and "started on device 1" in log
    # Nothing serves /sized: a 503 at once, not a wait for the timeout.
    impatient = web(STREAMER_TIMEOUT=10.0)
    response = wait_for(
        lambda: (lambda r: r if r.status_code == 503 else None)(impatient.test_client().post("/sized", json=1)), 5
    )
    assert response is not None, "a route with no worker was not refused"
    assert error_of(response, 503)["type"] == "NoWorkerError"
    cli.process.send_signal(signal.SIGTERM)
    assert cli.process.wait(20) == 0, cli.log()


def test_run_workers_waits_for_redis_and_stops_on_sigterm(tmp_path, run_workers):
    """Pointed at a Redis that does not answer, the command logs it once and
    waits rather than failing, never printing the URL's password; SIGTERM
    still stops it with 0."""
    from tests.servers import free_port

    url = f"redis://:s3cret-pw@127.0.0.1:{free_port()}/0"
    cli = run_workers(app=f"tests.flask.apps:create_redis_app({{'STREAMER_REDIS_URL': '{url}'}})")
    assert wait_for(lambda: "does not answer" in cli.log(), 20), cli.log()
    assert cli.workers() == [], "no worker should start before Redis answers"
    assert "s3cret-pw" not in cli.log(), "the Redis password was printed"
    assert "double: 1 worker(s) on redis://***@127.0.0.1" in cli.log()
    cli.process.send_signal(signal.SIGTERM)
    assert cli.process.wait(10) == 0, cli.log()


def test_only_the_test_s_keys_are_left_and_none_of_them_holds_work(web, run_workers, redis_url, prefix):
    """After the calls are answered and everything has stopped, no request is
    left queued or pending, and every other key (the answers' streams)
    expires on its own."""
    cli = run_workers("--route", "double")
    app = web()
    until_served(app, "/double", 0)
    for x in range(5):
        assert app.test_client().post("/double", json=x).get_json() == 2 * x, cli.log()
    cli.process.send_signal(signal.SIGTERM)
    assert cli.process.wait(20) == 0
    close_streamers(app)
    conn = redis.Redis.from_url(redis_url, socket_timeout=5, decode_responses=True)
    try:
        keys = list(conn.scan_iter(match=f"streamer:{prefix}:*", count=1000))
        assert requests_key(prefix, "double") in keys, f"the route's request stream should be there: {keys}"
        for key in keys:
            if key.endswith(":requests"):
                assert conn.xlen(key) == 0, f"{key} still holds requests"
                for group in conn.xinfo_groups(key):
                    assert group["pending"] == 0, f"{key} has unacknowledged requests"
            else:
                assert conn.ttl(key) > 0, f"{key} never expires"
    finally:
        conn.close()


def test_run_workers_refuses_an_app_whose_routes_are_not_on_redis():
    """``flask --app example_flask streamer run-workers`` with the example's
    default thread backend: a usage error (exit code 2) saying what to set."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    for name in [key for key in env if key.startswith("FLASK_")]:
        env.pop(name)
    done = subprocess.run(
        [sys.executable, "-m", "flask", "--app", "example_flask", "streamer", "run-workers"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2, done.stderr
    assert "run-workers runs Redis workers, but stream, classify use another backend" in done.stderr
    assert "STREAMER_BACKEND = 'redis'" in done.stderr


@pytest.mark.parametrize(
    "config, args, message",
    [
        ({}, ["--route", "nope"], "no batched route named nope; the app has double, sized, boom"),
        ({"STREAMER_BACKEND": "thread"}, [], "but double, sized, boom use another backend: set STREAMER_BACKEND"),
        ({}, ["--workers", "0"], "Invalid value for '--workers'"),
    ],
)
def test_run_workers_usage_errors(config, args, message):
    app = create_redis_app({"STREAMER_REDIS_URL": "redis://127.0.0.1:1/0", **config})
    result = app.test_cli_runner().invoke(args=["streamer", "run-workers", *args])
    assert result.exit_code == 2, result.output
    assert message in result.output


def test_run_workers_needs_the_extension():
    app = Flask("no_streamer")
    from flask_streamer.cli import streamer_cli

    app.cli.add_command(streamer_cli)
    result = app.test_cli_runner().invoke(args=["streamer", "run-workers"])
    assert result.exit_code == 2 and "flask_streamer is not set up on this app" in result.output


def test_workers_do_not_outlive_a_killed_run_workers(run_workers, redis_url, prefix):
    """SIGKILL leaves the command no time to stop its workers: they notice
    their parent is gone and exit by themselves, within a second or two."""
    cli = run_workers("--route", "double", "--workers", "2")
    assert wait_for(lambda: len(cli.workers()) == 2, 30), cli.log()
    # Killed once their models are loaded: a worker still starting (its
    # interpreter importing the app) watches its parent only from then on.
    assert wait_for(lambda: beating_workers(redis_url, prefix) == 2, 30), cli.log()
    pids = cli.workers()
    os.kill(cli.pid, signal.SIGKILL)
    cli.process.wait(5)
    assert wait_for(lambda: not any(alive(pid) for pid in pids), 2), "workers outlived their killed command"


def test_the_default_codec_reaches_the_web_side_and_the_cli_workers_which_refuse_pickle(
    web, run_workers, redis_url, prefix, tmp_path, monkeypatch
):
    """Nothing is unpickled unless the user opts in: the requests the web
    side writes are msgpack, and the workers that ``flask streamer
    run-workers`` starts refuse a pickled request planted in their stream
    (which would create a directory were it unpickled)."""
    hold = tmp_path / "hold"
    monkeypatch.setenv("HOLD_FILE", str(hold))
    app = web(WITH_HOLD_ROUTE=True)
    cli = run_workers("--route", "hold", app="tests.flask.apps:create_redis_app({'WITH_HOLD_ROUTE': True})")
    assert until_served(app, "/hold", "warm").get_json() == "warm", cli.log()
    conn = redis.Redis.from_url(redis_url, socket_timeout=5)
    key = requests_key(prefix, "hold")
    try:
        hold.write_text("")
        held, outcome = in_background(lambda: app.test_client().post("/hold", json="held"))
        assert wait_for(lambda: conn.xlen(key) == 1, 10)
        [(_, request)] = conn.xrange(key)
        assert request[b"k"] == b"msgpack", f"the web side wrote {request[b'k']!r} requests"
        marker = tmp_path / "pwned"
        conn.xadd(key, {"c": "forger", "i": "x1", "t": 60_000, "k": "pickle", "p": pickle.dumps(Evil(str(marker)))})
        hold.unlink()
        held.join(10)
        assert outcome["result"].get_json() == "held"
        answers = f"{key.rsplit(':', 1)[0]}:results:forger"
        assert wait_for(lambda: conn.xlen(answers) == 1, 10), cli.log()
        [(_, answer)] = conn.xrange(answers)
        assert answer[b"ok"] == b"0" and b"refuses 'pickle'" in answer[b"p"]  # answered as 0.1.0 reads it
        assert not marker.exists(), "a worker unpickled a request from Redis"
    finally:
        conn.close()
