"""Uploaded files as model inputs: a view's ``field`` names a JSON key, a
form field or a file, and a file arrives as bytes; a body over
``STREAMER["MAX_BODY_BYTES"]`` is refused with a JSON 413 before it is read."""

from __future__ import annotations

import os
from typing import Any

from django.core.checks import run_checks
from django.test import Client

from tests.flask.test_example_classify import upload

PAYLOAD = os.urandom(300_000) + b"\x00\xff"


def test_a_file_arrives_as_its_bytes(client: Client) -> None:
    response = client.post("/upload", **upload(PAYLOAD, "data.bin"))
    assert response.status_code == 200, response.content
    assert response.json() == {"type": "bytes", "length": len(PAYLOAD), "head": PAYLOAD[:8].hex()}
    # A form field of the same name still comes first, as text.
    response = client.post("/upload", {"file": "typed in"})
    assert response.json()["type"] == "str"


def test_a_body_over_the_limit_is_a_413(client: Client, settings: Any) -> None:
    settings.STREAMER = dict(settings.STREAMER, MAX_BODY_BYTES=100_000)
    response = client.post("/upload", **upload(PAYLOAD))
    assert response.status_code == 413 and response["Content-Type"] == "application/json", response.content
    error = response.json()["error"]
    assert error["type"] == "PayloadTooLarge" and "100000" in error["message"]
    assert client.post("/upload", **upload(PAYLOAD[:50_000])).status_code == 200
    settings.STREAMER = dict(settings.STREAMER, MAX_BODY_BYTES=None)
    assert client.post("/upload", **upload(PAYLOAD * 12)).status_code == 200  # 3.6 MB: no limit


def test_empty_or_missing_files_are_a_400(client: Client) -> None:
    for kwargs, message in ((upload(b""), "is empty"), (upload(b"x", field="other"), 'the file "file"')):
        response = client.post("/upload", **kwargs)
        assert response.status_code == 400, response.content
        assert message in response.json()["error"]["message"]


def test_a_bad_limit_is_a_system_check_error(settings: Any) -> None:
    for bad in (0, -5, "10MB", 1.5, True):
        settings.STREAMER = dict(settings.STREAMER, MAX_BODY_BYTES=bad)
        messages = [error.msg for error in run_checks() if error.id == "django_streamer.E009"]
        assert any("MAX_BODY_BYTES" in message and "at least 1" in message for message in messages), (bad, messages)
    settings.STREAMER = dict(
        settings.STREAMER, MODELS={"double": {"MODEL": "tests.django.batch_models.double", "MAX_BODY_BYTES": 5}}
    )
    messages = [error.msg for error in run_checks() if error.id == "django_streamer.E008"]
    assert any("set once for every model, at the top level" in message for message in messages), messages
