"""The operations routes of the Flask extension (metrics, liveness, readiness),
the ``flask streamer status`` command for in-process backends, and a graceful
drain: against real Flask, real gunicorn and real model loading."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path
from typing import Any, Callable, Dict, Set, Tuple

import pytest
from flask import Flask

from flask_streamer import FlaskStreamer
from streamer_core import ManagedModel
from streamer_core.errors import ConfigurationError
from streamer_core.web.probes import PROBE_BUDGET_S
from tests.flask.live import fire, free_port, get, gunicorn_argv, in_background, live_server
from tests.helpers import metric_samples, wait_for

ROUTES = {"STREAMER_METRICS_ROUTE": "/metrics", "STREAMER_HEALTH_ROUTE": "/healthz", "STREAMER_READY_ROUTE": "/readyz"}


class SlowLoading(ManagedModel):
    """A model that takes ``seconds`` to load (built in the web process by the thread backend)."""

    def init_model(self, seconds: float = 1.5) -> None:
        time.sleep(seconds)

    def predict(self, batch: Any) -> Any:
        return [x * 2 for x in batch]


class NeverLoads(ManagedModel):
    def init_model(self) -> None:
        raise OSError("weights not found at /nowhere")

    def predict(self, batch: Any) -> Any:  # pragma: no cover - never built
        return batch


def test_routes_are_off_by_default(make_app: Callable[..., Tuple[Flask, FlaskStreamer]]) -> None:
    app, streamer = make_app()
    streamer.add_batched_route("/double", "double", lambda batch: [x * 2 for x in batch])
    client = app.test_client()
    assert [client.get(path).status_code for path in ROUTES.values()] == [404, 404, 404]


def test_bad_route_settings_are_refused_at_init_app(make_app: Callable[..., Tuple[Flask, FlaskStreamer]]) -> None:
    with pytest.raises(ConfigurationError, match=r"STREAMER_READY_ROUTE must be a URL path .*'/readyz'.*'readyz'"):
        make_app({"STREAMER_READY_ROUTE": "readyz"})
    with pytest.raises(ConfigurationError, match="did you mean STREAMER_HEALTH_ROUTE"):
        make_app({"STREAMER_HEALTH_ROUTES": "/healthz"})


def test_liveness_and_metrics_in_process(make_app: Callable[..., Tuple[Flask, FlaskStreamer]]) -> None:
    app, streamer = make_app(ROUTES)
    streamer.add_batched_route("/double", "ops_double", lambda batch: [x * 2 for x in batch])
    client = app.test_client()
    health = client.get("/healthz")
    assert (health.status_code, health.json) == (200, {"status": "alive"})
    assert [client.post("/double", json=x).json for x in range(5)] == [0, 2, 4, 6, 8]
    assert client.post("/double", data="{", content_type="application/json").status_code == 400
    scraped = client.get("/metrics")
    assert scraped.status_code == 200 and scraped.content_type.startswith("text/plain")
    found = metric_samples(scraped.text)
    model = ("model", "ops_double")
    assert found[("streamer_requests_total", (model, ("outcome", "ok")))] == 5
    assert found[("streamer_requests_total", (model, ("outcome", "invalid")))] == 1
    assert found[("streamer_batch_size_sum", (model,))] == 5
    assert found[("streamer_queue_wait_seconds_count", (model,))] == 5
    assert client.post("/metrics").status_code == 405


def test_a_413_is_counted_too_large_and_a_415_invalid(make_app: Callable[..., Tuple[Flask, FlaskStreamer]]) -> None:
    app, streamer = make_app(dict(ROUTES, STREAMER_MAX_BODY_BYTES=100))
    streamer.add_batched_route("/double", "ops_limits", lambda batch: [x * 2 for x in batch])
    client = app.test_client()
    assert client.post("/double", json=list(range(100))).status_code == 413
    assert client.post("/double", data="3", content_type="text/plain").status_code == 415
    assert client.post("/double", json=4).json == 8
    found = metric_samples(client.get("/metrics").text)
    model = ("model", "ops_limits")
    counted = {o: found[("streamer_requests_total", (model, ("outcome", o)))] for o in ("ok", "invalid", "too_large")}
    assert counted == {"ok": 1, "invalid": 1, "too_large": 1}


def test_where_a_model_starts_is_said_first_use_or_boot(
    make_app: Callable[..., Tuple[Flask, FlaskStreamer]], caplog: Any
) -> None:
    import logging

    from flask_streamer import start_streamers

    caplog.set_level(logging.INFO, logger="streamer_core")
    lazy, lazy_streamer = make_app()
    lazy_streamer.add_batched_route("/double", "starts_lazily", lambda batch: [x * 2 for x in batch])
    booted, booted_streamer = make_app()
    booted_streamer.add_batched_route("/double", "starts_at_boot", lambda batch: [x * 2 for x in batch])
    assert lazy.test_client().post("/double", json=2).json == 4
    start_streamers(booted)
    said = {
        r.getMessage().split(" (")[0]: r.getMessage() for r in caplog.records if r.getMessage().startswith("model '")
    }
    assert said["model 'starts_lazily'"].endswith(
        "loading on its first use; the request that needs it waits "
        "(start_streamers() as the server boots loads it before any request)"
    )
    assert said["model 'starts_at_boot'"].endswith("loading as the server starts")


def test_readiness_waits_for_the_model_without_loading_it_in_the_probe(
    make_app: Callable[..., Tuple[Flask, FlaskStreamer]],
) -> None:
    app, streamer = make_app(ROUTES)
    streamer.add_batched_route("/double", "slow_loading", SlowLoading, init_kwargs={"seconds": 1.5})
    client = app.test_client()
    started = time.monotonic()
    first = client.get("/readyz")
    assert time.monotonic() - started < PROBE_BUDGET_S + 0.3  # answered while the model loads
    assert first.status_code == 503 and first.headers["Retry-After"]
    assert first.json["status"] == "unavailable"
    assert first.json["models"]["slow_loading"]["ready"] is False
    assert "loading" in first.json["models"]["slow_loading"]["reason"]
    assert client.get("/healthz").status_code == 200  # alive all along
    ready = wait_for(lambda: client.get("/readyz").status_code == 200, 10)
    assert ready
    assert client.get("/readyz").json == {
        "status": "ready",
        "models": {"slow_loading": {"backend": "thread", "ready": True}},
    }
    assert client.post("/double", json=4).json == 8


def test_every_probe_while_a_model_loads_says_it_is_starting(
    make_app: Callable[..., Tuple[Flask, FlaskStreamer]],
) -> None:
    """The second probe during a load, or one while a request loads the
    model, waited for the load's lock and said only "its check did not
    answer within 0.8s" (a newcomer saw it on Django's runserver). Each
    probe says the model is starting, within the probe's budget."""
    app, streamer = make_app(ROUTES)
    streamer.add_batched_route("/double", "slow_loading", SlowLoading, init_kwargs={"seconds": 3.0})
    client = app.test_client()
    calling = threading.Thread(target=client.post, args=("/double",), kwargs={"json": 2})
    calling.start()  # a request loads the model
    time.sleep(0.2)
    for _ in range(3):
        started = time.monotonic()
        answer = client.get("/readyz")
        assert time.monotonic() - started < PROBE_BUDGET_S + 0.3
        reason = answer.json["models"]["slow_loading"]["reason"]
        assert answer.status_code == 503 and reason == "starting: the model is loading in this process", reason
    calling.join(10)
    assert wait_for(lambda: client.get("/readyz").status_code == 200, 10)


def test_readiness_names_a_model_that_cannot_load(make_app: Callable[..., Tuple[Flask, FlaskStreamer]]) -> None:
    app, streamer = make_app(ROUTES)
    streamer.add_batched_route("/broken", "never_loads", NeverLoads)
    streamer.add_batched_route("/double", "fine", lambda batch: batch)
    client = app.test_client()
    answer = wait_for(lambda: (r := client.get("/readyz")).json["models"]["never_loads"].get("reason", "").startswith(
        "the model could not start") and r, 5)  # fmt: skip
    assert answer.status_code == 503
    assert "weights not found" in answer.json["models"]["never_loads"]["reason"]
    assert answer.json["models"]["fine"] == {"backend": "thread", "ready": True}


def test_readiness_of_the_process_backend_follows_its_workers(
    make_app: Callable[..., Tuple[Flask, FlaskStreamer]],
) -> None:
    app, streamer = make_app({**ROUTES, "STREAMER_BACKEND": "process"})
    # The worker takes a second to load its model.
    streamer.add_batched_route("/slow", "slow_process", SlowLoading, init_kwargs={"seconds": 1.0})
    client = app.test_client()
    first = client.get("/readyz")
    assert first.status_code == 503, first.json
    assert wait_for(lambda: client.get("/readyz").status_code == 200, 30)


def test_drain_answers_new_calls_503_and_lets_calls_in_hand_finish(
    make_app: Callable[..., Tuple[Flask, FlaskStreamer]],
) -> None:
    entered, release = threading.Event(), threading.Event()

    def held(batch: Any) -> Any:
        entered.set()
        assert release.wait(10)
        return batch

    app, streamer = make_app(ROUTES)
    streamer.add_batched_route("/held", "held", held)
    client = app.test_client()
    in_hand, box = in_background(lambda: app.test_client().post("/held", json=1))
    assert entered.wait(5)  # the call is inside the model
    drainer, _ = in_background(streamer.drain, app, 5.0)
    wait_for(lambda: app.extensions["streamer"].draining, 2)
    refused = client.post("/held", json=2)
    assert refused.status_code == 503 and refused.headers["Retry-After"]
    assert client.get("/readyz").status_code == 503
    assert client.get("/healthz").status_code == 200
    release.set()
    in_hand.join(5)
    drainer.join(10)
    assert box["result"].status_code == 200 and box["result"].json == 1  # the call in hand finished


@pytest.mark.parametrize(
    "worker, graceful_timeout",
    [("gthread", 10), ("gevent_pywsgi", 10), ("gthread", 0)],
    ids=["graceful", "graceful-gevent_pywsgi", "control-killed-at-once"],
)
def test_gunicorn_sigterm_under_load_answers_every_accepted_request(
    tmp_path: Path, worker: str, graceful_timeout: int
) -> None:
    """SIGTERM to gunicorn (gthread, and the examples' gevent_pywsgi; no hook) while 32 clients keep calling:
    every request that entered the app is answered, the calls in flight
    with their results. Connections the server never took (refused once the
    listener closed, or reset in the kernel's backlog by its closing) are
    not requests it took; the app writes a line for each one it took, as it
    enters. The control gives gunicorn no time to finish (SIGKILL right
    after SIGTERM), and the test must see the calls it drops."""
    port = free_port()
    entered = tmp_path / "entered.log"
    argv = gunicorn_argv(port, "-k", worker, "--threads", "64")
    argv[argv.index("--graceful-timeout") + 1] = str(graceful_timeout)
    settings = {"MODEL_SLEEP": 0.1, "REQUEST_LOG": str(entered)}
    with live_server(argv, port, settings) as server:
        assert server.process is not None
        busy, box = in_background(fire, port, "/predict", 32, 40, 15.0, "drain")
        wait_for(lambda: entered.exists() and len(entered.read_text().splitlines()) > 64, 10)  # under load
        os.kill(server.process.pid, signal.SIGTERM)
        busy.join(60)
        server.process.wait(30)
    volley = box["result"]
    answered = [r for r in volley.replies if r.status > 0]
    took = [line for line in entered.read_text().splitlines() if line == "/predict"]
    assert len(answered) < len(volley.replies), "the test stopped the server after every client had finished"
    if graceful_timeout == 0:
        assert len(took) > len(answered), "the control dropped no call: the test cannot see dropped calls"
        return
    assert len(took) == len(answered), (
        f"{len(took)} requests entered the app and {len(answered)} answers reached their clients: {volley.summary()}"
    )
    assert {r.status for r in answered} <= {200, 503}, volley.summary()
    assert all(r.body["x"] == r.sent for r in answered if r.status == 200)


def test_gunicorn_workers_metrics_add_up_in_multiprocess_mode(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two gunicorn workers, each with its own streamer: a scrape of either
    reports the calls of both (prometheus_client's multiprocess mode)."""
    folder = tmp_path / "prometheus"
    folder.mkdir()
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(folder))
    port = free_port()
    settings: Dict[str, Any] = {"STREAMER_METRICS_ROUTE": "/metrics", "MODEL_SLEEP": 0.01}
    with live_server(gunicorn_argv(port, "-w", "2", "-k", "gthread", "--threads", "16"), port, settings):
        served: Set[int] = set()
        sent = 0
        for _ in range(8):  # on a loaded machine one worker may take a whole volley: send more
            volley = fire(port, "/predict", 16, 10, tag="metrics")
            volley.check_answers()
            served |= volley.pids()
            sent += 160
            if len(served) == 2:
                break
        assert len(served) == 2, "both workers should have served"
        for _ in range(4):  # whichever worker answers, the sums are the same
            status, text, _ = get(port, "/metrics")
            assert status == 200
            found = metric_samples(text)
            model = ("model", "predict")
            assert found[("streamer_requests_total", (model, ("outcome", "ok")))] == sent
            assert found[("streamer_batch_size_sum", (model,))] == sent
            assert found[("streamer_queue_wait_seconds_count", (model,))] == sent
            batches = found[("streamer_batch_size_count", (model,))]
            assert found[("streamer_model_seconds_count", (model,))] == batches < sent
