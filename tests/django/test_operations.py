"""The operations side of the Django app: ``include("django_streamer.urls")``
(metrics, liveness, readiness), ``manage.py streamer_status`` and ``drain``,
through Django's test client and ``call_command``."""

from __future__ import annotations

import io
import json
import threading
from typing import Any

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.test import Client

import django_streamer.registry as registry
from django_streamer import drain, get_streamer
from tests.helpers import metric_samples, wait_for


def post(client: Client, url: str, data: Any) -> Any:
    return client.post(url, json.dumps(data), content_type="application/json")


def ok_count(client: Client, model: str) -> float:
    found = metric_samples(client.get("/ops/metrics").content.decode())
    return found.get(("streamer_requests_total", (("model", model), ("outcome", "ok"))), 0.0)


def test_metrics_count_the_views_calls_by_model(client: Client) -> None:
    before_ok = ok_count(client, "double")
    before = metric_samples(client.get("/ops/metrics").content.decode())
    invalid_key = ("streamer_requests_total", (("model", "double"), ("outcome", "invalid")))
    for x in range(6):
        assert post(client, "/double", {"x": x}).json() == 2 * x
    assert post(client, "/double", {"y": 1}).status_code == 400
    response = client.get("/ops/metrics")
    assert response.status_code == 200 and response["Content-Type"].startswith("text/plain")
    found = metric_samples(response.content.decode())
    assert found[("streamer_requests_total", (("model", "double"), ("outcome", "ok")))] == before_ok + 6
    assert found[invalid_key] == before.get(invalid_key, 0.0) + 1
    stats = get_streamer("double").stats()
    assert found[("streamer_batch_size_sum", (("model", "double"),))] == stats.batch_size.sum
    assert found[("streamer_workers_live", (("model", "double"),))] == 1
    assert client.post("/ops/metrics").status_code == 405


def test_a_413_is_counted_too_large_and_a_415_invalid(client: Client, streamer_settings: Any) -> None:
    streamer_settings(MAX_BODY_BYTES=100)
    before = metric_samples(client.get("/ops/metrics").content.decode())

    def key(outcome: str) -> Any:
        return ("streamer_requests_total", (("model", "double"), ("outcome", outcome)))

    assert post(client, "/double", {"x": list(range(100))}).status_code == 413
    assert client.post("/double", "3", content_type="text/plain").status_code == 415
    assert post(client, "/double", {"x": 4}).json() == 8
    found = metric_samples(client.get("/ops/metrics").content.decode())
    counted = {o: found[key(o)] - before.get(key(o), 0.0) for o in ("ok", "invalid", "too_large")}
    assert counted == {"ok": 1, "invalid": 1, "too_large": 1}


def test_a_model_loading_on_its_first_request_is_said(client: Client, streamer_settings: Any, caplog: Any) -> None:
    """runserver loads a model on the request that first needs it: a line
    says so before the wait, not only once it is over."""
    import logging

    streamer_settings(models={"double": {"MODEL": "tests.django.batch_models.double"}})  # none started yet
    caplog.set_level(logging.INFO, logger="streamer_core")
    assert post(client, "/double", {"x": 2}).json() == 4
    said = [r.getMessage() for r in caplog.records if r.getMessage().startswith("model 'double' ")]
    assert said and said[0].startswith("model 'double' (thread backend): loading on its first use;"), said
    assert "start_streamers()" in said[0]


def test_liveness_and_readiness(client: Client, streamer_settings: Any) -> None:
    streamer_settings(models={"double": {"MODEL": "tests.django.batch_models.double"}})
    assert client.get("/ops/healthz").json() == {"status": "alive"}
    ready = wait_for(lambda: client.get("/ops/readyz").status_code == 200, 5)
    assert ready
    assert client.get("/ops/readyz").json() == {
        "status": "ready",
        "models": {"double": {"backend": "thread", "ready": True}},
    }


def test_readiness_is_503_naming_a_model_that_cannot_load(client: Client, streamer_settings: Any) -> None:
    streamer_settings(
        models={
            "double": {"MODEL": "tests.django.batch_models.double"},
            "missing": {"MODEL": "tests.django.batch_models.BrokenModel"},
        }
    )

    def answer() -> Any:
        response = client.get("/ops/readyz")
        reason = response.json()["models"]["missing"].get("reason", "")
        return response if reason.startswith("the model could not start") else None

    response = wait_for(answer, 10)
    assert response.status_code == 503 and response["Retry-After"]
    assert response.json()["models"]["double"]["ready"] is True


@pytest.mark.parametrize("backend", ["thread", "process"])
def test_readiness_is_503_while_the_model_loads_then_200(
    client: Client, streamer_settings: Any, tmp_path: Any, backend: str
) -> None:
    """Readiness says not ready while the model loads, in this process (the
    thread backend, a streamer started on a thread of its own) or in its
    workers (the process backend), and ready once it can serve."""
    # Loads until the file "go" exists.
    model = {"MODEL": "tests.redis.models.GatedLoadModel", "INIT_KWARGS": {"folder": str(tmp_path)}}
    streamer_settings(models={"gated": model}, BACKEND=backend)
    first = client.get("/ops/readyz")
    assert first.status_code == 503 and first["Retry-After"], first.content
    reason = first.json()["models"]["gated"]["reason"]
    assert "loading" in reason, reason
    assert client.get("/ops/readyz").status_code == 503, "still loading"
    (tmp_path / "go").write_text("")
    assert wait_for(lambda: client.get("/ops/readyz").status_code == 200, 30)


def test_drain_refuses_new_calls_and_finishes_those_in_hand(
    client: Client, monkeypatch: pytest.MonkeyPatch, tmp_path: Any, streamer_settings: Any
) -> None:
    monkeypatch.setattr(registry, "_draining", False)  # put back after the test
    streamer_settings(
        models={
            "double": {"MODEL": "tests.django.batch_models.double"},
            "hold": {"MODEL": "tests.django.batch_models.HoldModel", "INIT_KWARGS": {"folder": str(tmp_path)}},
        }
    )
    (tmp_path / "hold").touch()
    held = get_streamer("hold").submit([3])
    assert wait_for(lambda: list(tmp_path.glob("inside-*")), 10)  # the call is inside the model
    drainer = threading.Thread(target=drain, args=(10.0,))
    drainer.start()
    assert wait_for(registry.draining, 2)
    refused = post(client, "/double", {"x": 1})
    assert refused.status_code == 503 and refused["Retry-After"]
    assert refused.json()["error"]["type"] == "StreamerClosedError"
    response = client.get("/ops/readyz")
    assert response.status_code == 503
    assert response.json()["models"]["hold"]["reason"] == "this process is shutting down"
    assert client.get("/ops/healthz").status_code == 200
    (tmp_path / "hold").unlink()
    drainer.join(15)
    assert held.result(5) == [6]  # the call in hand finished with its result


def test_status_command_fails_when_any_model_cannot_serve(streamer_settings: Any, redis_url: str) -> None:
    """One model served, another on Redis with no worker: the command says
    which, and exits 1, as a probe or a deploy script reads it."""
    streamer_settings(
        models={
            "double": {"MODEL": "tests.django.batch_models.double"},
            "remote": {"MODEL": "tests.django.batch_models.double", "BACKEND": "redis", "REDIS_URL": redis_url},
        },
        PREFIX="django-status-no-workers",
    )
    out = io.StringIO()
    with pytest.raises(CommandError, match="a model cannot serve") as info:
        call_command("streamer_status", stdout=out)
    assert info.value.returncode == 1
    text = out.getvalue()
    assert "double [thread] ok:" in text and "remote [redis] PROBLEM:" in text, text
    assert "start them (manage.py run_gpu_workers or streamer-worker)" in text, "Django's own command, not Flask's"


def test_status_command_for_in_process_backends() -> None:
    out = io.StringIO()
    call_command("streamer_status", stdout=out)
    text = out.getvalue()
    assert "double [thread] ok: batch_size=8" in text
    out = io.StringIO()
    call_command("streamer_status", "--model", "double", "--json", stdout=out)
    report = json.loads(out.getvalue())
    assert report["ok"] is True and list(report["models"]) == ["double"]
    assert report["models"]["double"]["settings"]["batch_size"] == 8
    with pytest.raises(CommandError, match="no model named 'nope'"):
        call_command("streamer_status", "--model", "nope", stdout=io.StringIO())


def test_status_command_answers_json_when_it_cannot_ask(streamer_settings: Any) -> None:
    """With ``--json``, what stops the command (a model name that is none,
    wrong settings) is still one JSON object on standard output, not ok,
    saying why, as well as the error and its exit status."""
    out = io.StringIO()
    with pytest.raises(CommandError, match="no model named 'nope'"):
        call_command("streamer_status", "--model", "nope", "--json", stdout=out)
    report = json.loads(out.getvalue())
    assert report["ok"] is False and report["models"] == {}
    [error] = report["errors"]
    assert error.startswith("no model named 'nope' in STREAMER['MODELS']; the models are 'double', "), report
    streamer_settings(models={"double": {"MODEL": "tests.django.batch_models.double", "BATCH_SIZE": 0}})
    out = io.StringIO()
    with pytest.raises(CommandError, match="bad settings.STREAMER") as info:
        call_command("streamer_status", "--json", stdout=out)
    assert info.value.returncode == 1
    report = json.loads(out.getvalue())
    assert report["ok"] is False and report["models"] == {}
    assert any("['BATCH_SIZE'] must be a whole number >= 1, got 0" in line for line in report["errors"]), report


def test_status_command_says_a_thread_backend_s_model_threads(streamer_settings: Any) -> None:
    streamer_settings(
        models={
            "double": {"MODEL": "tests.django.batch_models.double", "MODEL_THREADS": 2},
            "single": {"MODEL": "tests.django.batch_models.double"},
        }
    )
    out = io.StringIO()
    call_command("streamer_status", stdout=out)
    text = out.getvalue()
    double, single = text.splitlines()
    assert double.startswith("double [thread] ok: ") and double.endswith(", model_threads=2"), text
    assert single.startswith("single [thread] ok: ") and "model_threads" not in single, text
