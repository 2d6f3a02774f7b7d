"""A request's deadline, from its headers (``streamer_core.web.deadline``):
``X-Request-Timeout`` (seconds) and, where a route allows it, Envoy's
``x-envoy-expected-rq-timeout-ms``: the call's timeout is the client's
remaining wait, never more than the route's; a malformed one is a 400
before anything is queued; an input whose caller will have left is never
run."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Dict, List

import pytest

from tests.flask.apps import double
from tests.flask.conftest import error_of, post_in_thread, queue_behind_hold

ENVOY = "x-envoy-expected-rq-timeout-ms"


@pytest.mark.parametrize(
    ("header", "value"),
    [
        ("X-Request-Timeout", "abc"),
        ("X-Request-Timeout", "0"),
        ("X-Request-Timeout", "-1"),
        ("X-Request-Timeout", "nan"),
        ("X-Request-Timeout", "inf"),
        ("X-Request-Timeout", "1e3"),
        ("X-Request-Timeout", ""),
        ("x-envoy-expected-rq-timeout-ms", "2.5"),
        ("x-envoy-expected-rq-timeout-ms", "0"),
    ],
)
def test_a_malformed_deadline_is_a_400_before_anything_is_read_or_queued(make_app, header: str, value: str) -> None:
    app, streamer = make_app({"STREAMER_ENVOY_TIMEOUT": True})
    parsed: List[Any] = []
    ran: List[Any] = []
    streamer.add_batched_route("/double", "double", ran.extend, parse=lambda request: parsed.append(1) or 1)
    counted = app.extensions["streamer"].extension.get_streamer("double", app).stats
    before = counted().requests["invalid"]
    error = error_of(app.test_client().post("/double", json=1, headers={header: value}), 400)
    assert error["type"] == "InvalidInput" and header in error["message"] and "greater than 0" in error["message"]
    assert parsed == [] and ran == [], "refused before the body is read or anything is queued"
    assert counted().requests["invalid"] == before + 1


@pytest.mark.parametrize(("value", "seconds"), [(" 0.3 ", 0.3), ("0.25", 0.25), (".3", 0.3), ("100", 0.4)])
def test_the_calls_timeout_is_the_clients_wait_never_more_than_the_routes(
    make_app, gated, pool, value: str, seconds: float
) -> None:
    app, streamer = make_app({"STREAMER_TIMEOUT": 0.4, "STREAMER_BATCH_SIZE": 8})
    streamer.add_batched_route("/gated", "gated", gated)
    held, (late,) = queue_behind_hold(pool, app, "/gated", "gated", gated, ["late"])
    started = time.monotonic()
    held_call = late  # queued behind the held batch: it ends at its deadline
    # The queued call's timeout is what its request said: 504 at it.
    fresh = post_in_thread(pool, app, "/gated", json="fresh", headers={"X-Request-Timeout": value})
    answer = fresh.result(10)
    waited = time.monotonic() - started
    assert error_of(answer, 504)["type"] == "StreamerTimeoutError"
    assert f"within its timeout of {seconds:.3g}s" in answer.get_json()["error"]["message"]
    assert seconds - 0.05 <= waited < seconds + 1.0, waited
    gated.release()
    held.result(10)
    held_call.result(10)
    assert "fresh" not in gated.seen(), "an input whose caller left is never run"


def _deadline_app(make_app, config: Dict[str, Any], **route: Any) -> Any:
    app, streamer = make_app({"STREAMER_TIMEOUT": 0.5, **config})
    streamer.add_batched_route("/slow", "slow", lambda batch: time.sleep(1.0) or batch, **route)
    return app


@pytest.mark.parametrize(
    ("config", "route", "headers", "seconds"),
    [
        ({}, {}, {"X-Request-Timeout": "0.2"}, 0.2),
        ({}, {}, {"x-envoy-expected-rq-timeout-ms": "200"}, 0.5),  # not allowed: ignored
        ({"STREAMER_ENVOY_TIMEOUT": True}, {}, {"x-envoy-expected-rq-timeout-ms": "200"}, 0.2),
        ({}, {"envoy_timeout": True}, {"x-envoy-expected-rq-timeout-ms": "200"}, 0.2),
        (
            {"STREAMER_ENVOY_TIMEOUT": True},
            {},
            {"X-Request-Timeout": "0.3", "x-envoy-expected-rq-timeout-ms": "200"},
            0.2,
        ),
        ({"STREAMER_TIMEOUT_HEADER": None}, {}, {"X-Request-Timeout": "0.2"}, 0.5),
        ({}, {"timeout_header": None}, {"X-Request-Timeout": "0.2"}, 0.5),
        ({}, {"timeout_header": "X-Patience"}, {"X-Patience": "0.2", "X-Request-Timeout": "0.3"}, 0.2),
    ],
)
def test_which_headers_say_the_deadline(make_app, config, route, headers, seconds: float) -> None:
    app = _deadline_app(make_app, config, **route)
    answer = app.test_client().post("/slow", json=1, headers=headers)
    assert f"within its timeout of {seconds:.3g}s" in error_of(answer, 504)["message"]


def test_a_deadline_option_that_is_not_one_is_refused_where_it_is_set(make_app) -> None:
    from streamer_core.errors import ConfigurationError

    with pytest.raises(ConfigurationError, match="STREAMER_TIMEOUT_HEADER must be the name of a request header"):
        make_app({"STREAMER_TIMEOUT_HEADER": "not a header"})
    with pytest.raises(ConfigurationError, match="STREAMER_ENVOY_TIMEOUT must be True or False"):
        make_app({"STREAMER_ENVOY_TIMEOUT": "yes"})
    _, streamer = make_app()
    with pytest.raises(TypeError, match="timeout_header of the batched route '/x' must be the name of a request"):
        streamer.add_batched_route("/x", model=double, timeout_header=5)
    with pytest.raises(TypeError, match="envoy_timeout of the batched route '/y' must be True"):
        streamer.add_batched_route("/y", model=double, envoy_timeout="yes")


def test_on_the_process_backend_an_input_past_its_clients_deadline_never_reaches_the_worker(make_app, tmp_path) -> None:
    from tests.core.models import RecordingGate, ran_inputs
    from tests.helpers import wait_for

    app, streamer = make_app({"STREAMER_BACKEND": "process", "STREAMER_WORKER_NUM": 1, "STREAMER_TIMEOUT": 20})
    streamer.add_batched_route("/gate", "gate", RecordingGate, init_kwargs={"folder": str(tmp_path)})
    client = app.test_client()
    assert client.post("/gate", json="warm").get_json() == "ok:warm"  # the worker is up
    (tmp_path / "hold").write_text("")
    with ThreadPoolExecutor(1) as pool:
        held = pool.submit(lambda: app.test_client().post("/gate", json="hold"))
        assert wait_for(lambda: (tmp_path / "inside").exists(), 10), "the worker never took the held input"
        late = client.post("/gate", json="late", headers={"X-Request-Timeout": "0.3"})
        assert late.status_code == 504 and "within its timeout of 0.3s" in late.get_json()["error"]["message"]
        (tmp_path / "hold").unlink()
        assert held.result(10).get_json() == "ok:hold"
    assert client.post("/gate", json="after").get_json() == "ok:after"
    assert ran_inputs(tmp_path) == ["warm", "hold", "after"], "an input past its client's deadline reached the model"
