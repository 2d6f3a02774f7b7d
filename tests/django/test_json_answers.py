"""What a batched view answers: NumPy arrays written as they are (orjson,
where it is installed) and read back to the same float32 values, and bodies
that no JSON reader should choke on refused with a JSON 400."""

from __future__ import annotations

import json

import numpy as np
import pytest
from django.test import Client

from tests.django.batch_models import vectors
from tests.django.test_json_errors import error_of
from tests.django.test_views import post
from tests.helpers import failure_behind


def test_an_array_output_is_answered_as_its_float32_values(client: Client) -> None:
    response = post(client, "/vectors", {"n": 384})
    assert response.status_code == 200 and response["Content-Type"] == "application/json"
    [expected] = vectors([384])
    assert np.array_equal(np.asarray(json.loads(response.content), dtype=np.float32), expected)


def test_a_body_nested_too_deep_is_a_json_400(client: Client) -> None:
    deep = "[" * 100_000 + "]" * 100_000
    for url in ("/vectors", "/double", "/adouble"):
        error = error_of(client.post(url, deep, content_type="application/json"), 400)
        assert "not valid JSON" in error["message"]


def test_an_output_with_no_json_form_is_a_json_500(client: Client, caplog: pytest.LogCaptureFixture) -> None:
    failure = failure_behind(error_of(post(client, "/vectors", {"n": "set"}), 500), caplog.records)
    assert "set" in str(failure)
