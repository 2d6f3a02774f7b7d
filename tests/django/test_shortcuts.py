"""``STREAMER["SHORTCUTS"]``: the project's switch of the shortcut through
Django's request (``django-body`` of ``streamer_core.shortcuts``). Off,
Django's ``request.body`` reads every body, under Django's own limits, and
a body sent in chunks, which Django's WSGI request does not read, is a 411
that says why; the line logged as the app is ready says so."""

from __future__ import annotations

import io
import json
import logging
from typing import Any, Dict

import pytest
from django.core.checks import run_checks
from django.core.handlers.wsgi import WSGIHandler
from django.core.signals import request_finished, request_started
from django.db import close_old_connections
from django.test import Client

from django_streamer.apps import say_which_shortcuts


def _chunked(body: bytes, coding: str = "chunked") -> Dict[str, Any]:
    """A WSGI environ of a request to ``/double`` whose body the server
    decoded from chunks (as gunicorn does): no ``Content-Length``."""
    return {
        "REQUEST_METHOD": "POST",
        "PATH_INFO": "/double",
        "SERVER_NAME": "testserver",
        "SERVER_PORT": "80",
        "wsgi.url_scheme": "http",
        "CONTENT_TYPE": "application/json",
        "HTTP_TRANSFER_ENCODING": coding,
        "wsgi.input": io.BytesIO(body),
        "wsgi.input_terminated": True,
    }


def _served(environ: Dict[str, Any]) -> Any:
    """``environ`` served by Django's WSGI handler, as Django's test client
    serves it: without closing database connections around the request
    (pytest-django refuses the database to a test that does not ask)."""
    started: Dict[str, Any] = {}
    request_started.disconnect(close_old_connections)
    request_finished.disconnect(close_old_connections)
    try:
        body = b"".join(WSGIHandler()(environ, lambda status, headers: started.update(status=status)))
    finally:
        request_started.connect(close_old_connections)
        request_finished.connect(close_old_connections)
    return started["status"], json.loads(body)


@pytest.fixture(autouse=True)
def _no_environment_switch(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("STREAMER_SHORTCUTS", raising=False)


@pytest.mark.parametrize("coding", ["chunked", "Chunked", "CHUNKED"])
def test_with_the_shortcut_on_a_body_in_chunks_is_read(settings: Any, coding: str) -> None:
    settings.STREAMER = dict(settings.STREAMER, SHORTCUTS=True, MAX_BODY_BYTES=20)
    assert _served(_chunked(b'{"x": 21}', coding)) == ("200 OK", 42)
    status, answer = _served(_chunked(b'{"x": "' + b"y" * 30 + b'"}', coding))  # past MAX_BODY_BYTES
    assert status.startswith("413") and answer["error"]["type"] == "PayloadTooLarge"


def test_switched_off_a_body_in_chunks_is_a_411_saying_why(settings: Any) -> None:
    settings.STREAMER = dict(settings.STREAMER, SHORTCUTS=False)
    status, answer = _served(_chunked(b'{"x": 21}'))
    assert status.startswith("411") and answer["error"]["type"] == "LengthRequired"
    assert "django-body shortcut, which is off here" in answer["error"]["message"]


def test_switched_off_djangos_own_limit_holds_for_every_body(client: Client, settings: Any) -> None:
    # 3 MB: over Django's DATA_UPLOAD_MAX_MEMORY_SIZE (2.5 MB, left as it is),
    # under STREAMER["MAX_BODY_BYTES"] (10 MiB), the one limit the shortcut reads by.
    body = json.dumps({"x": 1, "padding": "x" * 3_000_000})
    settings.STREAMER = dict(settings.STREAMER, SHORTCUTS=True)
    assert client.post("/double", body, content_type="application/json").json() == 2
    settings.STREAMER = dict(settings.STREAMER, SHORTCUTS=False)
    refused = client.post("/double", body, content_type="application/json")
    assert refused.status_code == 413 and "DATA_UPLOAD_MAX_MEMORY_SIZE" in refused.json()["error"]["message"]


@pytest.mark.parametrize("on", [True, False])
def test_the_ready_line_says_which_shortcuts_are_on(settings: Any, caplog: Any, on: bool) -> None:
    settings.STREAMER = dict(settings.STREAMER, SHORTCUTS=on)
    with caplog.at_level(logging.INFO, "streamer_core.shortcuts"):
        say_which_shortcuts()
    (line,) = [record.getMessage() for record in caplog.records if record.name == "streamer_core.shortcuts"]
    assert line.startswith("shortcuts through other packages' private workings: on: ")
    assert ("django-body (django " in line.split("; off")[0]) is on
    if not on:
        assert (
            "django-body, gevent-reading, gevent-writing, gunicorn-access-log (STREAMER['SHORTCUTS'] is False)" in line
        )


def test_a_switch_that_is_not_a_flag_is_a_system_check_error(settings: Any) -> None:
    settings.STREAMER = dict(settings.STREAMER, SHORTCUTS="sometimes")
    messages = [error.msg for error in run_checks() if error.id == "django_streamer.E009"]
    assert any("STREAMER['SHORTCUTS']" in message for message in messages), messages
