"""A request's deadline from its headers on every form of batched view
(``streamer_core.web.deadline``): ``X-Request-Timeout`` (seconds) shortens
the call's timeout, never past the model's; Envoy's header where the view
or the project allows it; a malformed one is a 400 before anything is read
or queued."""

from __future__ import annotations

import asyncio
import json
from typing import Any, Dict

import pytest
from django.test import AsyncClient, Client

FORMS = ["/slow", "/aslow", "/slow-cbv", "/aslow-cbv", "/rest-slow"]


@pytest.fixture(autouse=True)
def _slow_project(settings: Any, streamer_settings: Any) -> None:
    settings.ROOT_URLCONF = "tests.django.urls_deadline"
    models = dict(settings.STREAMER["MODELS"], slow={"MODEL": "tests.django.batch_models.slow", "TIMEOUT": 0.6})
    streamer_settings(models=models)


def _post(url: str, headers: Dict[str, str]) -> Any:
    body, kind = json.dumps({"x": 1}), "application/json"
    if url.startswith("/a"):
        return asyncio.run(AsyncClient().post(url, body, content_type=kind, headers=headers))
    return Client().post(url, body, content_type=kind, headers=headers)


def _message(response: Any) -> str:
    answer = response.json()
    return str(answer["detail"] if "detail" in answer else answer["error"]["message"])


@pytest.mark.parametrize("url", FORMS)
def test_the_clients_wait_is_the_calls_timeout_on_every_form_of_view(url: str) -> None:
    response = _post(url, {"X-Request-Timeout": "0.2"})
    assert response.status_code == 504 and "within its timeout of 0.2s" in _message(response), response.content
    bounded = _post(url, {"X-Request-Timeout": "30"})
    assert bounded.status_code == 504 and "within its timeout of 0.6s" in _message(bounded), bounded.content


@pytest.mark.parametrize("url", FORMS)
def test_a_malformed_deadline_is_a_400(url: str) -> None:
    response = _post(url, {"X-Request-Timeout": "soon"})
    assert response.status_code == 400, response.content
    assert "X-Request-Timeout header must be a number of seconds greater than 0" in _message(response)


@pytest.mark.parametrize(
    ("url", "headers", "seconds"),
    [
        ("/slow", {"x-envoy-expected-rq-timeout-ms": "200"}, 0.6),  # not allowed here
        ("/envoy", {"x-envoy-expected-rq-timeout-ms": "200"}, 0.2),
        ("/deaf", {"X-Request-Timeout": "0.2"}, 0.6),
        ("/rest-slow", {"x-envoy-expected-rq-timeout-ms": "200"}, 0.6),
    ]
    + [(url, {"x-envoy-expected-rq-timeout-ms": "200"}, 0.2) for url in ("/envoy-cbv", "/aenvoy-cbv", "/rest-envoy")]
    + [(url, {"X-Request-Timeout": "0.2"}, 0.6) for url in ("/deaf-cbv", "/adeaf-cbv", "/rest-deaf")],
)
def test_which_headers_a_view_reads(url: str, headers: Dict[str, str], seconds: float) -> None:
    response = _post(url, headers)
    assert response.status_code == 504 and f"within its timeout of {seconds:.3g}s" in _message(response)


def test_the_projects_settings_say_which_headers_are_read(streamer_settings: Any, settings: Any) -> None:
    streamer_settings(ENVOY_TIMEOUT=True, TIMEOUT_HEADER="X-Patience")
    response = _post(
        "/slow", {"x-envoy-expected-rq-timeout-ms": "300", "X-Patience": "0.2", "X-Request-Timeout": "0.1"}
    )
    assert response.status_code == 504 and "within its timeout of 0.2s" in _message(response)
    response = _post("/slow", {"x-envoy-expected-rq-timeout-ms": "200"})  # Envoy's alone: the project allows it
    assert response.status_code == 504 and "within its timeout of 0.2s" in _message(response)
    streamer_settings(TIMEOUT_HEADER=None)
    response = _post("/slow", {"X-Request-Timeout": "0.1"})
    assert response.status_code == 504 and "within its timeout of 0.6s" in _message(response)
