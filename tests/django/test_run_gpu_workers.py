"""``manage.py run_gpu_workers`` as a real subprocess against a real Redis:
it serves the views' requests, restarts a killed worker, drains on SIGTERM
and exits 0, waits for a Redis that does not answer with a clear log line;
and refuses wrong options with a CommandError saying what to fix."""

from __future__ import annotations

import io
import json
import os
import signal
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Iterator

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.test import Client

from django_streamer import get_streamer
from tests.helpers import alive, beating_workers, wait_for
from tests.servers import delete_prefix, free_port, worker_children


@pytest.fixture
def broker(redis_url: str, redis_prefix: str) -> Iterator[str]:
    """The session's Redis; this test's keys are deleted at its end (never FLUSHALL)."""
    yield redis_url
    delete_prefix(redis_url, redis_prefix)


def start_workers(commands: Any, url: str, prefix: str, *args: str, **env: str) -> Any:
    return commands.start(
        "run_gpu_workers",
        *args,
        env=commands.env(
            TEST_STREAMER_BACKEND="redis", TEST_STREAMER_REDIS_URL=url, TEST_STREAMER_PREFIX=prefix, **env
        ),
    )


def post(url: str, x: Any) -> Any:
    return Client().post(url, json.dumps({"x": x}), content_type="application/json")


def test_serves_requests_and_restarts_a_killed_worker(commands, broker, redis_prefix, streamer_settings):
    streamer_settings(BACKEND="redis", REDIS_URL=broker, PREFIX=redis_prefix, TIMEOUT=20)
    workers = start_workers(
        commands, broker, redis_prefix, "--model", "pid", "--model", "double", "-v", "1", "--devices", "0,1"
    )
    assert wait_for(lambda: len(worker_children(workers.pid)) == 3, 30), commands.log(workers)
    first = worker_children(workers.pid)
    assert get_streamer("double").wait_ready(30) and get_streamer("pid").wait_ready(30), commands.log(workers)
    response = post("/double", 21)
    assert (response.status_code, response.json()) == (200, 42), commands.log(workers)
    status = io.StringIO()
    call_command("streamer_status", "--model", "double", stdout=status)
    # worker_num counts per run of Django's own command, named as a Django user runs it.
    assert "per run_gpu_workers command)" in status.getvalue(), status.getvalue()
    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(lambda x: post("/pid", x), range(16)))
    assert [r.status_code for r in answers] == [200] * 16
    served_by = {r.json()[1] for r in answers}
    assert served_by <= set(first)

    victim = next(iter(served_by))
    os.kill(victim, signal.SIGKILL)
    assert wait_for(lambda: len(set(worker_children(workers.pid)) - set(first)) == 1, 20), commands.log(workers)
    assert not alive(victim) and workers.poll() is None
    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(lambda x: post("/pid", x), range(16)))
    assert [r.json()[0] for r in answers] == list(range(16))
    log = commands.log(workers)
    assert "restarting it" in log
    assert f"pid: 2 worker(s) on device(s) 0, 1, Redis {broker}, keys streamer:{redis_prefix}:pid:*" in log
    assert "double: 1 worker(s) on device(s) 0, 1" in log  # --devices overrides the settings' None
    assert "pid worker 1 (pid" in log and "started on device 1" in log  # -v 1: INFO lines


def test_sigterm_lets_the_batch_in_hand_finish_then_exits_0(
    commands, broker, redis_prefix, streamer_settings, tmp_path
):
    (tmp_path / "hold").write_text("")
    streamer_settings(
        BACKEND="redis",
        REDIS_URL=broker,
        PREFIX=redis_prefix,
        TIMEOUT=20,
        models={"hold": {"MODEL": "tests.django.batch_models.HoldModel", "INIT_KWARGS": {"folder": str(tmp_path)}}},
    )
    workers = start_workers(
        commands,
        broker,
        redis_prefix,
        "--model",
        "hold",
        "--workers",
        "2",
        "-v",
        "0",
        TEST_STREAMER_FOLDER=str(tmp_path),
    )
    assert get_streamer("hold").wait_ready(30), commands.log(workers)
    future = get_streamer("hold").submit([5])
    assert wait_for(lambda: list(tmp_path.glob("inside-*")), 30), commands.log(workers)
    children = worker_children(workers.pid)
    assert len(children) == 2
    workers.send_signal(signal.SIGTERM)
    time.sleep(0.5)
    assert workers.poll() is None, "SIGTERM must wait for the batch in hand"
    (tmp_path / "hold").unlink()
    assert future.result(10) == [10]
    assert workers.wait(20) == 0, commands.log(workers)
    assert not any(alive(pid) for pid in children), "worker processes outlived the command"
    assert "started on device" not in commands.log(workers)  # -v 0: warnings and errors only


def test_waits_for_redis_with_a_clear_log_line_and_stops_on_sigterm(commands, redis_prefix):
    workers = start_workers(commands, f"redis://127.0.0.1:{free_port()}/0", redis_prefix, "--model", "double")
    assert wait_for(lambda: "does not answer" in commands.log(workers), 20), commands.log(workers)
    time.sleep(1.0)  # several attempts, one line
    log = commands.log(workers)
    assert log.count("does not answer") == 1 and "Traceback" not in log, log
    assert workers.poll() is None and worker_children(workers.pid) == []
    workers.send_signal(signal.SIGTERM)
    assert workers.wait(10) == 0, commands.log(workers)


@pytest.fixture
def redis_settings(streamer_settings: Any) -> Any:
    return streamer_settings(BACKEND="redis", REDIS_URL="redis://127.0.0.1:1/0")


@pytest.mark.parametrize(
    "args, message",
    [
        (["--model", "ghost"], "no model named 'ghost' in STREAMER['MODELS']; the models are 'double', 'sizes'"),
        (["--workers", "0"], "expected a whole number >= 1, got 0"),
        (["--devices", ","], "--devices must name at least one device"),
    ],
)
def test_wrong_options_are_command_errors(redis_settings, args, message):
    with pytest.raises(CommandError) as raised:
        call_command("run_gpu_workers", *args)
    assert message in str(raised.value)


def test_models_on_another_backend_are_refused(streamer_settings):
    with pytest.raises(CommandError, match=r"'double' \(thread\).*set STREAMER\['BACKEND'\] = 'redis'"):
        call_command("run_gpu_workers", "--model", "double")


def test_bad_settings_are_a_command_error_with_the_check_ids(streamer_settings):
    streamer_settings(BACKEND="redis", REDIS_URL=None)
    with pytest.raises(CommandError, match=r"django_streamer.E007"):
        call_command("run_gpu_workers")


def test_workers_do_not_outlive_a_killed_command(commands, broker, redis_prefix):
    """SIGKILL leaves the command no time to stop its workers: they notice
    their parent is gone and exit by themselves, within a second or two."""
    workers = start_workers(commands, broker, redis_prefix, "--model", "double", "--workers", "2")
    assert wait_for(lambda: len(worker_children(workers.pid)) == 2, 30), commands.log(workers)
    # Killed once their models are loaded: a worker still starting (its
    # interpreter importing the app) watches its parent only from then on.
    assert wait_for(lambda: beating_workers(broker, redis_prefix) == 2, 30), commands.log(workers)
    pids = worker_children(workers.pid)
    os.kill(workers.pid, signal.SIGKILL)
    workers.wait(5)
    assert wait_for(lambda: not any(alive(pid) for pid in pids), 2), "workers outlived their killed command"


def test_the_default_codec_reaches_the_web_side_and_the_workers_which_refuse_pickle(
    commands, broker, redis_prefix, streamer_settings, tmp_path
):
    """Nothing is unpickled unless the user opts in: the requests the web
    side writes are msgpack, and the workers that ``run_gpu_workers`` starts
    refuse a pickled request planted in their stream (which would create a
    directory were it unpickled)."""
    import pickle
    import threading

    import redis

    from tests.redis.models import Evil

    streamer_settings(BACKEND="redis", REDIS_URL=broker, PREFIX=redis_prefix, TIMEOUT=20)
    settings_models = dict(streamer_settings()["MODELS"])
    settings_models["hold"] = dict(settings_models["hold"], INIT_KWARGS={"folder": str(tmp_path)})
    streamer_settings(models=settings_models)
    workers = start_workers(commands, broker, redis_prefix, "--model", "hold", TEST_STREAMER_FOLDER=str(tmp_path))
    streamer = get_streamer("hold")
    assert streamer.wait_ready(30), commands.log(workers)
    conn = redis.Redis.from_url(broker, socket_timeout=5)
    key = f"streamer:{redis_prefix}:hold:requests"
    try:
        (tmp_path / "hold").write_text("")
        held = threading.Thread(target=lambda: streamer.predict([21]), daemon=True)
        held.start()
        assert wait_for(lambda: list(tmp_path.glob("inside-*")), 10), commands.log(workers)
        [(_, request)] = conn.xrange(key)
        assert request[b"k"] == b"msgpack", f"the web side wrote {request[b'k']!r} requests"
        marker = tmp_path / "pwned"
        conn.xadd(key, {"c": "forger", "i": "x1", "t": 60_000, "k": "pickle", "p": pickle.dumps(Evil(str(marker)))})
        (tmp_path / "hold").unlink()
        held.join(10)
        answers = f"streamer:{redis_prefix}:hold:results:forger"
        assert wait_for(lambda: conn.xlen(answers) == 1, 10), commands.log(workers)
        [(_, answer)] = conn.xrange(answers)
        assert answer[b"ok"] == b"0" and b"refuses 'pickle'" in answer[b"p"]  # answered as 0.1.0 reads it
        assert not marker.exists(), "a worker unpickled a request from Redis"
    finally:
        conn.close()


def test_one_device_given_as_a_single_number_is_that_device():
    """``--devices 0`` and ``CUDA_DEVICES: 0``, as a one-GPU box is set up,
    are device 0 (both were refused as not a list)."""
    from django_streamer.management.commands.run_gpu_workers import Command

    assert Command()._devices("0") == (0,)
    assert Command()._devices("1,0") == (1, 0)
    with pytest.raises(CommandError, match="--devices holds -1"):
        Command()._devices("-1")
