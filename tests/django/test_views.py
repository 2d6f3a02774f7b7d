"""The batched views through Django's test client: parse -> batch -> JSON,
with the Flask extension's HTTP mapping (400, 500, 504, 503 + Retry-After),
streamers started lazily and closed at exit."""

from __future__ import annotations

import json
import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Dict

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.test import Client

from django_streamer import close_streamers, get_spec, get_streamer, model_names, started_models
from tests.helpers import alive, failure_behind, wait_for
from tests.servers import free_port


def post(client: Client, url: str, data: Any) -> Any:
    return client.post(url, json.dumps(data), content_type="application/json")


def test_json_and_form_inputs_are_answered_as_json(client):
    response = post(client, "/double", {"x": 21})
    assert response.status_code == 200 and response["Content-Type"] == "application/json"
    assert response.json() == 42
    assert client.post("/double", {"x": "21"}).json() == 42  # the form field
    assert post(client, "/adouble", {"x": "ab"}).json() == "abab"
    assert post(client, "/double-cbv", {"x": 5}).json() == 10


def test_unparsable_input_is_400_with_a_message(client):
    for response, message in [
        (post(client, "/double", {"y": 1}), 'the JSON body has no key "x"'),
        (post(client, "/double", [1, 2]), 'send a JSON object with the key "x"'),
        (post(client, "/double", {"x": [1]}), '"x" must be a number or a string'),
        (client.post("/double", "{nope", content_type="application/json"), "the body is not valid JSON"),
        (
            client.post("/double", '{"x": "\xe9"}', content_type="application/json; charset=latin-1"),
            "the body is not valid JSON: it is not UTF-8 (byte 0xe9 at 7); JSON is sent in UTF-8",
        ),
        (client.post("/double", {}), 'send the input as JSON {"x": ...}, as the form field "x", or as the file "x"'),
        (post(client, "/double-cbv", {"y": 1}), 'the JSON body has no key "x"'),
    ]:
        assert response.status_code == 400, response.content
        error = response.json()["error"]
        assert error["status"] == 400 and error["type"] == "InvalidInput" and message in error["message"]
        assert "traceback" not in error
    assert started_models() == []  # no input reached a model


def test_a_model_error_is_500_for_that_input_only(client, settings, caplog):
    settings.STREAMER = dict(settings.STREAMER, MAX_LATENCY=0.3)  # let the calls meet in one batch
    answers: Dict[Any, Any] = {}

    def call(x: Any) -> None:
        response = post(Client(), "/double", {"x": x})
        answers[x] = (response.status_code, response.json())

    threads = [threading.Thread(target=call, args=(x,)) for x in (1, "boom", 3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(20)
    assert answers[1] == (200, 2) and answers[3] == (200, 6)
    status, body = answers["boom"]
    assert status == 500
    failure = failure_behind(body["error"], caplog.records)
    assert (type(failure), str(failure)) == (ValueError, "the model refuses 'boom'")


def test_debug_adds_the_traceback(client, settings):
    settings.DEBUG = True
    error = post(client, "/double", {"x": "boom"}).json()["error"]
    assert "Traceback" in error["traceback"] and "the model refuses" in error["traceback"]


def test_a_timeout_is_504(client, streamer_settings):
    streamer_settings({"double": {"MODEL": "tests.django.batch_models.slow", "TIMEOUT": 0.2}})
    response = post(client, "/double", {"x": 1})
    assert response.status_code == 504
    assert response.json()["error"]["type"] == "StreamerTimeoutError"


def test_a_model_that_cannot_load_is_503_with_retry_after(client, streamer_settings):
    streamer_settings({"double": {"MODEL": "tests.django.batch_models.BrokenModel"}})
    response = post(client, "/double", {"x": 1})
    assert response.status_code == 503 and response["Retry-After"] == "5"
    error = response.json()["error"]
    assert error["type"] == "WorkerStartError" and "the weights are missing" in error["message"]


def test_a_run_of_503s_is_logged_once_then_counted(client, streamer_settings, caplog, monkeypatch):
    """As in Flask: one log line for a run of like refusals, then a count."""
    from streamer_core.web import http

    monkeypatch.setattr(http, "_unavailable_seen", {})
    monkeypatch.setattr(http, "UNAVAILABLE_LOG_INTERVAL_S", 600.0)  # however slow the machine
    streamer_settings({"double": {"MODEL": "tests.django.batch_models.BrokenModel"}})
    caplog.set_level(logging.WARNING)

    def lines() -> list:
        return [r.getMessage() for r in caplog.records if "answered 503" in r.getMessage()]

    for n in range(20):
        assert post(client, "/double", {"x": n}).status_code == 503
    assert len(lines()) == 1 and "double" in lines()[0] and "the weights are missing" in lines()[0], lines()
    monkeypatch.setattr(http, "UNAVAILABLE_LOG_INTERVAL_S", 0.0)
    assert post(client, "/double", {"x": 20}).status_code == 503
    assert len(lines()) == 2 and "(19 more like it since the last such line)" in lines()[1], lines()


def test_redis_that_does_not_answer_is_503_with_retry_after(client, streamer_settings):
    streamer_settings(BACKEND="redis", REDIS_URL=f"redis://127.0.0.1:{free_port()}/0", TIMEOUT=5)
    response = post(client, "/double", {"x": 1})
    assert response.status_code == 503 and response["Retry-After"] == "5"
    assert response.json()["error"]["type"] == "BrokerUnavailableError"


def test_a_full_queue_is_503_with_retry_after_1(client, streamer_settings, tmp_path):
    (tmp_path / "hold").write_text("")
    streamer_settings(
        {
            "hold": {
                "MODEL": "tests.django.batch_models.HoldModel",
                "INIT_KWARGS": {"folder": str(tmp_path)},
                "BATCH_SIZE": 1,
                "MAX_QUEUE": 1,
                "MAX_LATENCY": 0,
            }
        }
    )
    streamer = get_streamer("hold")
    first = streamer.submit([1])
    assert wait_for(lambda: list(tmp_path.glob("inside-*")), 10)
    # A full batch (one input) is handed ahead to the busy model thread, out
    # of the queue: wait for that, then fill the queue's one place.
    second = streamer.submit([2])
    assert wait_for(lambda: streamer.queued() == 0, 10)
    third = streamer.submit([3])
    assert streamer.queued() == 1
    response = post(client, "/hold", {"x": 4})
    (tmp_path / "hold").unlink()
    assert response.status_code == 503 and response["Retry-After"] == "1"
    assert response.json()["error"]["type"] == "QueueFullError"
    assert first.result(10) == [2] and second.result(10) == [4] and third.result(10) == [6]


def test_other_methods_are_405(client):
    assert client.get("/double").status_code == 405
    assert client.get("/double-cbv").status_code == 405
    assert client.put("/double", "{}").status_code == 405


def test_url_arguments_reach_the_parse_function_and_respond_shapes_the_answer(client):
    assert client.post("/wrapped/7").json() == {"doubled": 14}
    assert client.put("/wrapped/8").json() == {"doubled": 16}


def test_batched_views_are_csrf_exempt_unless_told_otherwise():
    client = Client(enforce_csrf_checks=True)
    assert post(client, "/double", {"x": 1}).status_code == 200
    assert post(client, "/double-cbv", {"x": 1}).status_code == 200
    assert post(client, "/double-guarded", {"x": 1}).status_code == 403


def test_streamers_start_on_first_use_and_close(client):
    assert started_models() == []
    assert model_names() == ["double", "sizes", "pid", "hold", "marked", "vectors", "uploads", "gate", "ranked"]
    assert get_spec("hold").prefix == "django-tests:hold"
    assert client.post("/direct").json() == {"outputs": [2, 4, 6]}
    assert started_models() == ["double"]
    streamer = get_streamer("double")
    close_streamers()
    assert streamer.closed and started_models() == []
    assert get_streamer("double").predict([5]) == [10]  # started again


def test_an_unknown_model_name_is_improperly_configured():
    with pytest.raises(ImproperlyConfigured, match=r"no model named 'nope'.*'double', 'sizes'"):
        get_streamer("nope")


def test_bad_settings_at_run_time_are_improperly_configured_with_the_check_ids(streamer_settings):
    streamer_settings(BATCH_SIZE=0)
    with pytest.raises(ImproperlyConfigured, match=r"django_streamer.E004.*STREAMER\['BATCH_SIZE'\]"):
        get_streamer("double")


def test_the_view_declarations_are_checked_eagerly():
    from django_streamer import BatchedView, batched_view

    with pytest.raises(TypeError, match="name the model"):
        batched_view("")
    with pytest.raises(TypeError, match="respond"):
        batched_view("double", respond="json")
    with pytest.raises(TypeError, match="name the model"):
        BatchedView.as_view()


def test_the_process_backend_serves_from_a_worker_process_that_stops_at_exit(commands, tmp_path):
    """A real interpreter: the process backend's worker serves, and is gone
    once the interpreter exits (closed by atexit, not left orphaned)."""
    script = (
        "import os, django_streamer as ds\n"
        "[[x, pid]] = ds.get_streamer('pid').predict([7])\n"
        "print('ANSWER', x, pid, os.getpid(), flush=True)\n"
    )
    env = commands.env(TEST_STREAMER_BACKEND="process")
    result = commands.run("shell", "-c", script, env=env, timeout=60)
    assert result.returncode == 0, result.stderr
    [line] = [row for row in result.stdout.splitlines() if row.startswith("ANSWER")]
    _, x, worker, web = line.split()
    assert x == "7" and worker != web
    assert wait_for(lambda: not alive(int(worker)), 5), "the worker process outlived its web process"


@pytest.mark.parametrize("backend", ["thread", "process"])
def test_a_batch_in_hand_when_the_program_ends_is_finished_and_answered(commands, tmp_path, backend):
    """A ``manage.py shell`` program ends with a call in the model: the
    registry's exit-time close (and each streamer's own) lets the batch
    finish and its caller be answered, rather than cutting it off."""
    (tmp_path / "hold").write_text("")
    script = (
        "import time, pathlib, django_streamer as ds\n"
        "future = ds.get_streamer('hold').submit([21])\n"
        "future.add_done_callback(lambda f: print('ANSWERED', f.result(), flush=True))\n"
        f"while not list(pathlib.Path({str(tmp_path)!r}).glob('inside-*')): time.sleep(0.01)\n"
        "print('the program ends', flush=True)\n"
    )
    env = commands.env(TEST_STREAMER_BACKEND=backend, TEST_STREAMER_FOLDER=str(tmp_path))
    program = commands.start("shell", "-c", script, env=env)
    assert wait_for(lambda: "the program ends" in commands.log(program), 60), commands.log(program)
    time.sleep(0.3)  # the interpreter is shutting down, the batch still in the model
    (tmp_path / "hold").unlink()
    assert program.wait(30) == 0, commands.log(program)
    assert "ANSWERED [42]" in commands.log(program), f"the batch in hand at exit was cut off: {commands.log(program)}"


def test_a_cost_budget_shapes_the_batches_and_an_input_without_a_cost_is_400(streamer_settings):
    """``ITEM_COST`` as an import path, ``MAX_BATCH_COST`` and ``BATCH_COST``:
    no batch goes over the budget, and an input that cannot be costed is the
    client's error (400), refused before it reaches the model."""
    streamer_settings(
        {
            "sizes": {
                "MODEL": "tests.django.batch_models.with_batch",
                "ITEM_COST": "tests.django.batch_models.text_cost",
                "MAX_BATCH_COST": 12,
                "BATCH_COST": "sum",
                "MAX_LATENCY": 0.02,
            },
            "double": {"MODEL": "tests.django.batch_models.double"},
        }
    )
    texts = ["x" * (1 + i % 6) for i in range(48)]
    with ThreadPoolExecutor(16) as pool:
        answers = list(pool.map(lambda t: post(Client(), "/asizes", {"x": t}).json(), texts))
    assert [x for x, _ in answers] == texts
    for _, batch in answers:
        assert len(batch) == 1 or sum(map(len, batch)) <= 12, f"over the budget: {batch}"
    assert max(len(batch) for _, batch in answers) > 1, "nothing was ever batched"
    response = post(Client(), "/asizes", {"x": 7})
    assert response.status_code == 400, response.content
    error = response.json()["error"]
    assert error["type"] == "ItemCostError" and "expected a text, got int" in error["message"]
