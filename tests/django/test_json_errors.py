"""A batched view never answers HTML, whatever goes wrong: a method it does
not serve, a body too large or of a type it does not read, a bug in a
parse or respond hook, a wrong setting or model name, a failed CSRF check.
Every answer is the project's JSON error, as the Flask extension's."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.middleware.csrf import get_token
from django.test import Client, RequestFactory

from tests.django.test_views import post
from tests.helpers import failure_behind


def error_of(response: Any, status: int) -> dict:
    assert response.status_code == status, response.content[:300]
    assert response["Content-Type"] == "application/json", response.content[:300]
    error = json.loads(response.content)["error"]
    assert error["status"] == status
    return error


@pytest.mark.parametrize("url", ["/double", "/adouble", "/double-cbv", "/sizes-cbv"])
def test_a_method_the_view_does_not_serve_is_a_json_405_with_allow(client, url):
    for response in (client.get(url), client.put(url, "{}"), client.delete(url)):
        error = error_of(response, 405)
        assert response["Allow"] == "POST" and "use POST" in error["message"]


def test_a_body_over_the_upload_limit_is_a_json_413(client, settings):
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 100
    error = error_of(post(client, "/double", {"x": "y" * 1000}), 413)
    assert error["type"] == "PayloadTooLarge"


def test_a_body_of_a_type_that_is_not_read_is_a_json_415(client):
    response = client.post("/double", "<x>1</x>", content_type="application/xml")
    error = error_of(response, 415)
    assert "application/xml" in error["message"] and "application/json" in error["message"]
    assert post(client, "/double", {"x": 2}).json() == 4, "JSON is read"
    assert client.post("/double", {"x": "3"}).json() == 6, "and forms"


def test_a_bug_in_a_parse_function_is_a_json_500(client, caplog):
    failure = failure_behind(error_of(client.post("/broken-parse", {"x": 1}), 500), caplog.records)
    assert type(failure) is RuntimeError and "has a bug" in str(failure), "logged with its traceback"


def test_a_bug_in_a_respond_hook_is_a_json_500(client, caplog):
    failure = failure_behind(error_of(post(client, "/broken-respond", {"x": 1}), 500), caplog.records)
    assert type(failure) is ZeroDivisionError


def test_a_model_the_settings_lack_is_a_json_500_naming_it_in_the_log(client, streamer_settings, caplog):
    streamer_settings(models={"sizes": {"MODEL": "tests.django.batch_models.sizes"}})
    failure = failure_behind(error_of(post(client, "/double", {"x": 1}), 500), caplog.records)
    assert type(failure).__name__ == "ImproperlyConfigured" and "'double'" in str(failure)


def test_a_setting_made_wrong_at_run_time_is_a_json_500_naming_it_in_the_log(client, streamer_settings, caplog):
    streamer_settings(BATCH_SIZE=0)
    failure = failure_behind(error_of(post(client, "/double", {"x": 1}), 500), caplog.records)
    assert "STREAMER['BATCH_SIZE']" in str(failure) and "E004" in str(failure)


@pytest.mark.parametrize("url", ["/guarded", "/double-guarded"])
def test_a_failed_csrf_check_is_a_json_403_and_a_good_token_passes(url):
    client = Client(enforce_csrf_checks=True)
    error = error_of(post(client, url, {"x": 1}), 403)
    assert error["type"] == "CsrfFailure" and "CSRF" in error["message"]
    # A method the view does not take is a 405 first: no token would make it served.
    wrong_method = client.put(url, json.dumps({"x": 1}), content_type="application/json")
    assert error_of(wrong_method, 405)["type"] == "MethodNotAllowed" and wrong_method["Allow"] == "POST"
    token = get_token(RequestFactory().get("/"))
    client.cookies["csrftoken"] = token
    response = client.post(url, json.dumps({"x": 2}), content_type="application/json", HTTP_X_CSRFTOKEN=token)
    assert response.status_code == 200 and response.json() == 4


def test_an_input_the_parse_function_made_that_cannot_reach_a_worker_is_a_json_500(client, streamer_settings, caplog):
    """A client's JSON always crosses to a worker; a value the view's parse
    function made that cannot (a lock, which cannot be pickled) is the
    server's fault: a 500, never a 400."""
    streamer_settings(BACKEND="process")
    failure = failure_behind(error_of(client.post("/unpicklable", {"x": 1}), 500), caplog.records)
    assert type(failure).__name__ == "SerializationError" and "lock" in str(failure)
