"""A batched route that takes many inputs in one request (``many=True``):
each input is one of the model's, batched with other requests' inputs and
spread over batches, and the request gets their outputs in order."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any, List

import pytest

from flask_streamer import request_inputs
from tests.core import models
from tests.flask.conftest import error_of
from tests.flask.test_example_classify import upload
from tests.helpers import failure_behind


class Recorder:
    """Doubles its inputs and records each batch; an input of -1 fails alone."""

    def __init__(self) -> None:
        self.batches: List[List[Any]] = []
        self.lock = threading.Lock()

    def __call__(self, batch: List[Any]) -> List[Any]:
        with self.lock:
            self.batches.append(list(batch))
        if -1 in batch:
            raise ValueError("minus one is not taken")
        return [x * 2 for x in batch]


@pytest.mark.parametrize("backend", ["thread", "process"])
def test_a_request_of_many_inputs_gets_each_ones_output_in_order(make_app, backend):
    app, streamer = make_app({"STREAMER_BACKEND": backend, "STREAMER_BATCH_SIZE": 4})
    streamer.add_batched_route("/double", model=models.double, many=True)
    response = app.test_client().post("/double", json=list(range(10)))
    assert response.status_code == 200, response.get_data(as_text=True)
    assert response.get_json() == [2 * x for x in range(10)]


def test_the_inputs_of_a_request_are_batched_with_others_and_spread_over_batches(make_app):
    recorder = Recorder()
    app, streamer = make_app({"STREAMER_BATCH_SIZE": 4, "STREAMER_MAX_LATENCY": 0.2})
    streamer.add_batched_route("/double", "double", recorder, many=True)
    requests = [list(range(k * 100, k * 100 + 6)) for k in range(4)]
    with ThreadPoolExecutor(4) as pool:
        responses = list(pool.map(lambda xs: app.test_client().post("/double", json=xs), requests))
    assert [r.get_json() for r in responses] == [[2 * x for x in xs] for xs in requests]
    assert all(len(batch) <= 4 for batch in recorder.batches), recorder.batches
    assert sorted(x for batch in recorder.batches for x in batch) == sorted(x for xs in requests for x in xs)
    assert any(len({x // 100 for x in batch}) > 1 for batch in recorder.batches), "no batch mixed two requests"


def test_the_inputs_come_from_a_json_key_or_the_files_of_a_form_field(make_app):
    app, streamer = make_app()
    streamer.add_batched_route("/double", "double", models.double, many=True, field="xs")
    streamer.add_batched_route("/sizes", "sizes", lambda batch: [len(x) for x in batch], many=True, field="file")
    assert app.test_client().post("/double", json={"xs": [1, 2]}).get_json() == [2, 4]
    boundary = "streamer-test-boundary"
    parts = [upload(b"x" * n, f"f{n}.bin")["data"].replace(b"--" + boundary.encode() + b"--\r\n", b"") for n in (3, 5)]
    body = b"".join(parts) + f"--{boundary}--\r\n".encode()
    response = app.test_client().post("/sizes", data=body, content_type=f"multipart/form-data; boundary={boundary}")
    assert response.status_code == 200, response.get_data(as_text=True)
    assert response.get_json() == [3, 5]
    error = error_of(app.test_client().post("/sizes", data=body, content_type="multipart/form-data"), 400)
    assert error["message"].startswith("the multipart body has no boundary: send Content-Type: multipart/form-data;")


def test_what_is_not_a_list_is_a_400_and_more_than_max_inputs_a_413_before_anything_runs(make_app):
    recorder = Recorder()
    app, streamer = make_app({"STREAMER_MAX_INPUTS": 5})
    streamer.add_batched_route("/double", "double", recorder, many=True)
    streamer.add_batched_route("/few", "few", recorder, many=True, max_inputs=2)
    client = app.test_client()
    error = error_of(client.post("/double", json=3), 400)
    assert "send a list of inputs" in error["message"]
    error = error_of(client.post("/double", json=list(range(6))), 413)
    assert error["type"] == "PayloadTooLarge" and "6 inputs" in error["message"] and "5" in error["message"]
    assert error_of(client.post("/few", json=[1, 2, 3]), 413)["type"] == "PayloadTooLarge"
    assert recorder.batches == [], "nothing of a refused request reaches the model"
    assert client.post("/double", json=[]).get_json() == []
    assert client.post("/few", json=[1, 2]).get_json() == [2, 4]


def test_an_input_that_fails_names_its_index_and_the_rest_queued_is_dropped(make_app, caplog):
    """Inputs 0 and 1 run first (batches of 2); input 1 fails: the request
    fails with its index, and its inputs still queued never reach the model."""
    recorder = Recorder()
    app, streamer = make_app({"STREAMER_BATCH_SIZE": 2})
    streamer.add_batched_route("/double", "double", recorder, many=True)
    error = error_of(app.test_client().post("/double", json=[5, -1] + list(range(20))), 500)
    assert error["message"] == "input 1: internal error" and error["input"] == 1
    failure = failure_behind(error, caplog.records)
    assert (type(failure), str(failure)) == (ValueError, "minus one is not taken")
    ran = [x for batch in recorder.batches for x in batch]
    assert len(set(ran) - {5, -1}) <= 2, f"the failed request's queued inputs ran: {recorder.batches}"


def test_a_full_queue_refuses_the_whole_request(make_app, gate):
    """Nothing of a request that does not fit is queued (never half of it)."""
    app, streamer = make_app({"STREAMER_MAX_QUEUE": 5, "STREAMER_BATCH_SIZE": 1})
    streamer.add_batched_route("/gated", "gated", gate, many=True)
    client = app.test_client()
    with ThreadPoolExecutor(2) as pool:
        held = pool.submit(lambda: client.post("/gated", json=["hold"]))
        assert gate.entered.wait(10)
        error = error_of(client.post("/gated", json=[f"x{n}" for n in range(6)]), 503)
        assert error["type"] == "QueueFullError"
        gate.release()
        assert held.result(10).get_json() == ["ok:hold"]
    assert gate.seen() == ["hold"], "nothing of the refused request ran"
    assert client.post("/gated", json=["a", "b"]).get_json() == ["ok:a", "ok:b"]


def test_a_parse_hook_may_read_the_inputs_by_the_default_rule(make_app):
    app, streamer = make_app()
    streamer.add_batched_route(
        "/double", "double", models.double, many=True, parse=lambda req: [int(x) for x in request_inputs("n")]
    )
    assert app.test_client().post("/double", data={"n": ["1", "2", "3"]}).get_json() == [2, 4, 6]


def test_many_is_checked_where_the_route_is_declared(make_app):
    _, streamer = make_app()
    with pytest.raises(TypeError, match="many of the batched route '/x' must be True or False"):
        streamer.add_batched_route("/x", "x", models.double, many="yes")
    with pytest.raises(TypeError, match="max_inputs of the batched route '/y' goes with many=True"):
        streamer.add_batched_route("/y", "y", models.double, max_inputs=4)
    with pytest.raises(ValueError, match="max_inputs of the batched route '/z' must be a whole number >= 1"):
        streamer.add_batched_route("/z", "z", models.double, many=True, max_inputs=0)
