"""The process backend behind Flask: the route's model (a ManagedModel
subclass, or the decorated function) runs in spawned worker processes spread
over STREAMER_CUDA_DEVICES, and importing the app module in a worker (which
it does, to find the model) starts no workers there.

The app is ``tests.flask.apps.process_app``, made at import as a real app
module makes its app: STREAMER_WORKER_NUM=2 and STREAMER_CUDA_DEVICES=[0, 1]
app-wide, ``/where`` and ``/boom`` overriding them with one worker."""

from __future__ import annotations

import os
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Iterator

import pytest
from flask import Flask

from tests.flask import apps
from tests.flask.conftest import close_streamers, error_of
from tests.helpers import alive, failure_behind, wait_for
from tests.servers import worker_children

#: Spawning workers and answering must stay well within this, on 2 cores.
BOUND_S = 45.0


@pytest.fixture
def process_app() -> Iterator[Flask]:
    app = apps.process_app
    debug = app.debug
    started = time.monotonic()
    yield app
    app.debug = debug
    close_streamers(app, timeout=10)
    assert time.monotonic() - started < BOUND_S, "the process-backend test took too long"


def test_a_managed_model_runs_in_workers_one_per_device(process_app):
    streamer = apps.process_streamer.get_streamer("device", process_app)
    assert streamer.wait_ready(BOUND_S), "the two workers did not start"
    workers = streamer.worker_pids()
    assert len(workers) == 2 and os.getpid() not in workers
    assert set(workers) <= set(worker_children(os.getpid())), "workers are spawned children of the web process"

    answers = []

    def burst() -> bool:
        # Eight requests at once, each answer 0.05 s late: both workers get work.
        with ThreadPoolExecutor(8) as pool:
            responses = list(pool.map(lambda i: process_app.test_client().post("/device", json=i), range(8)))
        for i, response in enumerate(responses):
            assert response.status_code == 200, response.get_data(as_text=True)
            assert response.get_json()["x"] == i
            answers.append(response.get_json())
        return {answer["cvd"] for answer in answers} == {"0", "1"}

    assert wait_for(burst, 20, 0.0), f"not both devices served: {answers}"
    by_pid = {answer["pid"]: answer for answer in answers}
    assert set(by_pid) == set(workers), "every answer comes from one of the route's workers"
    for answer in by_pid.values():
        assert answer["cvd"] == str(answer["gpu_id"]), "CUDA_VISIBLE_DEVICES is set to the worker's device"
        assert answer["tag"] == "emb", "init_kwargs reach init_model"
    assert sorted(answer["gpu_id"] for answer in by_pid.values()) == [0, 1], "worker i gets devices[i % n]"


def test_importing_the_app_module_in_a_worker_starts_nothing_there(process_app):
    """The workers import tests.flask.apps, which makes ``process_app`` at
    import: they must start no streamer and spawn no process of their own."""
    response = process_app.test_client().post("/device", json="x")
    assert response.status_code == 200
    answer = response.get_json()
    assert answer["started"] == 0, "importing the app started its streamers inside a worker"
    assert answer["children"] == 0, "a worker started processes of its own"
    streamer = apps.process_streamer.get_streamer("device", process_app)
    for pid in streamer.worker_pids():
        assert worker_children(pid) == [], f"worker {pid} has spawned workers of its own"


def test_the_decorated_function_runs_in_a_worker_process(process_app):
    response = process_app.test_client().post("/where", json=7)
    assert response.status_code == 200
    answer = response.get_json()
    assert answer["x"] == 7
    assert answer["pid"] != os.getpid(), "the function ran in the web process, not a worker"
    assert (answer["children"], answer["started"]) == (0, 0)
    streamer = apps.process_streamer.get_streamer("where", process_app)
    assert streamer.worker_pids() == [answer["pid"]], "the route's worker_num=1 overrides STREAMER_WORKER_NUM=2"


def test_a_model_error_in_a_worker_is_a_500_with_the_worker_traceback_in_debug(process_app, caplog):
    client = process_app.test_client()
    failure = failure_behind(error_of(client.post("/boom", json="boom"), 500), caplog.records)
    assert (type(failure), str(failure)) == (ValueError, "the model cannot take 'boom'")
    assert "fail_on_boom" in failure.__cause__.tb, "the worker's traceback is logged"
    assert client.post("/boom", json="fine").get_json() == "ok:fine", "the worker keeps serving"
    process_app.debug = True
    error = error_of(client.post("/boom", json="boom"), 500)
    assert "fail_on_boom" in error["worker_traceback"], "the worker's own traceback is shown in debug mode"


def test_close_stops_the_workers_and_a_request_starts_them_again(process_app):
    client = process_app.test_client()
    first = client.post("/where", json=1).get_json()["pid"]
    apps.process_streamer.close(process_app, timeout=10)
    assert wait_for(lambda: not alive(first), 10), "the worker outlived close()"
    assert first not in worker_children(os.getpid())
    second = client.post("/where", json=2).get_json()["pid"]
    assert second != first and alive(second)
