"""Batched views that take many inputs in one request (``many=True``), as
function views (sync and async) and class-based ones: each input runs as
one of the model's, and the request gets the outputs in order."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from django.test import AsyncClient, Client

from django_streamer import batched_view
from django_streamer.views import BatchedView
from tests.django.test_views import post
from tests.helpers import failure_behind


def error_of(response: Any, status: int) -> Any:
    assert response.status_code == status and response["Content-Type"] == "application/json", response.content
    return json.loads(response.content)["error"]


@pytest.mark.parametrize("url", ["/double-many", "/double-many-cbv"])
def test_a_request_of_many_inputs_gets_each_ones_output_in_order(client: Client, url: str) -> None:
    xs = list(range(20))  # more than a batch of the test project's (8)
    response = post(client, url, xs)
    assert response.status_code == 200, response.content
    assert response.json() == [2 * x for x in xs]


def test_every_value_of_a_form_field_is_an_input(client: Client) -> None:
    assert client.post("/double-many", {"x": ["1", "2", "3"]}).json() == [2, 4, 6]


def test_an_async_view_of_many_awaits_their_outputs() -> None:
    async def main() -> Any:
        client = AsyncClient()
        body = json.dumps([1, 2, 3])
        return await asyncio.gather(
            client.post("/adouble-many", body, content_type="application/json"),
            client.post("/adouble-many", json.dumps([1, 2, 3, 4]), content_type="application/json"),
        )

    served, refused = asyncio.run(main())
    assert served.status_code == 200 and served.json() == [2, 4, 6]
    error = error_of(refused, 413)
    assert error["type"] == "PayloadTooLarge" and "4 inputs" in error["message"]


def test_more_than_max_inputs_is_a_413_and_not_a_list_a_400(client: Client, settings: Any) -> None:
    settings.STREAMER = dict(settings.STREAMER, MAX_INPUTS=4)
    error = error_of(post(client, "/double-many", [1, 2, 3, 4, 5]), 413)
    assert "5 inputs" in error["message"] and "4" in error["message"]
    assert "send a list of inputs" in error_of(post(client, "/double-many-cbv", {"x": 1}), 400)["message"]
    assert post(client, "/double-many", [1, 2, 3, 4]).json() == [2, 4, 6, 8]


def test_a_class_based_views_own_max_inputs_holds_under_the_settings(client: Client, settings: Any) -> None:
    settings.STREAMER = dict(settings.STREAMER, MAX_INPUTS=4)
    error = error_of(post(client, "/double-few-cbv", [1, 2, 3]), 413)
    assert "3 inputs" in error["message"] and "2" in error["message"], error
    assert post(client, "/double-few-cbv", [1, 2]).json() == [2, 4]


def test_an_input_that_fails_names_its_index(client: Client, caplog: Any) -> None:
    error = error_of(post(client, "/double-many", [1, 2, "boom"]), 500)
    assert error["message"] == "input 2: internal error" and error["input"] == 2, error
    assert str(failure_behind(error, caplog.records)) == "the model refuses 'boom'"


def test_an_input_that_fails_an_async_view_names_its_index(caplog: Any) -> None:
    async def main() -> Any:
        return await AsyncClient().post("/adouble-many", json.dumps([1, "boom", 3]), content_type="application/json")

    error = error_of(asyncio.run(main()), 500)
    assert error["message"] == "input 1: internal error" and error["input"] == 1, error
    assert str(failure_behind(error, caplog.records)) == "the model refuses 'boom'"


def test_many_is_checked_where_the_view_is_declared() -> None:
    with pytest.raises(TypeError, match="max_inputs of the batched view of 'double' goes with many=True"):
        batched_view("double", max_inputs=3)
    with pytest.raises(ValueError, match="must be a whole number >= 1"):
        BatchedView.as_view(model="double", many=True, max_inputs=0)
