"""What a 500 of a batched view tells the client: ``internal error`` and an
id, the id on the log line with the traceback; the exception's type and
message only where the project asks (``STREAMER["ERROR_DETAILS"]``, by
default ``DEBUG``), on every form of view, the DRF one included."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from django.core.checks import run_checks
from django.test import AsyncClient, Client

from tests.django.test_views import post
from tests.helpers import failure_behind


@pytest.mark.parametrize("url", ["/double", "/adouble", "/double-cbv"])
def test_a_500_says_internal_error_and_an_id_the_log_line_carries(client: Client, caplog: Any, url: str) -> None:
    if url == "/adouble":
        response = asyncio.run(AsyncClient().post(url, json.dumps({"x": "boom"}), content_type="application/json"))
    else:
        response = post(client, url, {"x": "boom"})
    assert response.status_code == 500, response.content
    error = response.json()["error"]
    assert (error["type"], error["message"], set(error)) == (
        "internal_error",
        "internal error",
        {"status", "type", "message", "id"},
    )
    failure = failure_behind(error, caplog.records)
    assert (type(failure), str(failure)) == (ValueError, "the model refuses 'boom'")


@pytest.mark.parametrize(
    ("setting", "debug", "shown", "traceback"),
    [(None, False, False, False), (None, True, True, True), (True, False, True, False), (False, True, False, False)],
)
def test_the_details_are_said_where_the_project_asks(
    client: Client, settings: Any, setting: Any, debug: bool, shown: bool, traceback: bool
) -> None:
    settings.DEBUG = debug
    if setting is not None:
        settings.STREAMER = dict(settings.STREAMER, ERROR_DETAILS=setting)
    error = post(client, "/double", {"x": "boom"}).json()["error"]
    said = (error["type"], error["message"])
    assert said == (("ValueError", "the model refuses 'boom'") if shown else ("internal_error", "internal error"))
    assert ("traceback" in error) is traceback


def test_the_drf_views_500_carries_its_id(caplog: Any) -> None:
    from rest_framework.test import APIClient

    response = APIClient().post("/rest/open", {"x": "boom"}, format="json")
    assert response.status_code == 500 and response.json()["detail"] == "internal error", response.content
    answer = response.json()
    error = {"status": 500, "type": "internal_error", "message": answer["detail"], "id": answer["id"]}
    assert str(failure_behind(error, caplog.records)) == "the model refuses 'boom'"


def test_a_setting_that_is_not_a_flag_or_none_is_a_system_check_error(settings: Any) -> None:
    settings.STREAMER = dict(settings.STREAMER, ERROR_DETAILS="yes")
    messages = [error.msg for error in run_checks() if error.id == "django_streamer.E009"]
    assert any("STREAMER['ERROR_DETAILS'] must be True or False" in message for message in messages), messages


def test_a_setting_made_wrong_after_the_checks_says_nothing_even_under_debug(client: Client, settings: Any) -> None:
    """A wrong ``ERROR_DETAILS`` (set after the system checks, as a test or
    ``runserver --skip-checks`` may) keeps a 500's details to the log, as
    ``False`` does, whatever ``DEBUG`` says."""
    settings.DEBUG = True
    settings.STREAMER = dict(settings.STREAMER, ERROR_DETAILS="no")
    error = post(client, "/double", {"x": "boom"}).json()["error"]
    assert (error["type"], error["message"]) == ("internal_error", "internal error") and "traceback" not in error
