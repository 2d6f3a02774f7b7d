"""From request to input and from result to response, and every error as
HTTP: 400 for input that cannot be parsed, 500 with the model's error, 504
on timeout, 503 with ``Retry-After`` when the queue is full or no worker or
broker is there. Every error body is JSON, and none of them hangs."""

from __future__ import annotations

import io
import logging
import threading
import time

import numpy as np
import pytest
from flask import Blueprint, Response, jsonify

from flask_streamer import InvalidInput
from tests.flask.apps import BrokenModel, double, fail_on_boom, sized
from tests.flask.conftest import error_of, queue_behind_hold
from tests.helpers import failure_behind
from tests.servers import free_port


def test_a_method_a_batched_route_does_not_serve_is_a_json_405_with_allow(make_app):
    """Every answer of a batched route is JSON, its 405 too; other routes
    keep Flask's own answer."""
    app, streamer = make_app()
    streamer.add_batched_route("/double", model=double, field="n")
    bp = Blueprint("api", __name__)
    streamer.add_batched_route("/sized", model=sized, blueprint=bp, methods=["POST", "PUT"])
    app.register_blueprint(bp, url_prefix="/api")

    @app.post("/plain")
    def plain() -> str:
        return "plain"

    client = app.test_client()
    for response, allowed in (
        (client.get("/double"), "OPTIONS, POST"),
        (client.delete("/api/sized"), "OPTIONS, POST, PUT"),
    ):
        error = error_of(response, 405)
        assert response.headers["Allow"] == allowed and error["type"] == "MethodNotAllowed"
    other = client.get("/plain")
    assert other.status_code == 405 and not other.is_json, "another route's 405 is Flask's"


def test_a_body_of_a_type_that_is_not_read_is_a_json_415(make_app):
    app, streamer = make_app()
    calls = []
    streamer.add_batched_route(
        "/double", model=lambda batch: calls.append(batch) or double(batch), field="n", endpoint="d"
    )
    streamer.add_batched_route("/sized", model=sized)
    client = app.test_client()
    error = error_of(client.post("/double", data="<n>1</n>", content_type="application/xml"), 415)
    assert error["type"] == "UnsupportedMediaType" and "application/xml" in error["message"]
    assert error["message"].endswith("send JSON (Content-Type: application/json) or a form")
    assert calls == []
    assert client.post("/double", json={"n": 2}).get_json() == 4
    assert client.post("/double", data={"n": "2"}).status_code == 200  # the form it offers is read
    # A route of the whole JSON body reads no form: its 415 offers none.
    error = error_of(client.post("/sized", data="<n>1</n>", content_type="application/xml"), 415)
    assert error["message"].endswith("is not read here: send JSON (Content-Type: application/json)"), error


def test_the_json_body_is_the_input_and_the_result_is_json(make_app):
    app, streamer = make_app()
    streamer.add_batched_route("/sized", model=sized)
    client = app.test_client()
    for body in (3, "text", [1, 2], {"a": [1, {"b": None}]}, True):
        response = client.post("/sized", json=body)
        assert response.status_code == 200 and response.is_json
        assert response.get_json() == {"x": body, "n": 1}
    assert client.post("/sized", data="null", content_type="application/json").get_json() == {"x": None, "n": 1}


def test_a_route_field_names_the_json_key_or_the_form_field(make_app):
    app, streamer = make_app()
    streamer.add_batched_route("/double", model=double, field="n")
    client = app.test_client()
    assert client.post("/double", json={"n": 21, "other": 0}).get_json() == 42
    assert client.post("/double", data={"n": "ab"}).get_json() == "abab", "a form field arrives as a string"


@pytest.mark.parametrize(
    "request_kwargs, message",
    [
        (dict(data="{not json", content_type="application/json"), "the body is not valid JSON"),
        (
            dict(data='{"n": "caf\xe9"}'.encode("latin-1"), content_type="application/json; charset=latin-1"),
            "the body is not valid JSON: it is not UTF-8 (byte 0xe9 at 10); JSON is sent in UTF-8",
        ),
        (dict(data="plain text"), "send the input as a JSON body (Content-Type: application/json)"),
        (dict(data={"n": "1"}), "send the input as a JSON body"),
        (dict(), "send the input as a JSON body"),
    ],
)
def test_input_that_cannot_be_parsed_is_a_400(make_app, request_kwargs, message):
    app, streamer = make_app()
    model_calls = []
    streamer.add_batched_route("/echo", "echo", lambda batch: model_calls.append(batch) or batch)
    error = error_of(app.test_client().post("/echo", **request_kwargs), 400)
    assert error["type"] == "InvalidInput" and message in error["message"]
    assert "traceback" not in error
    assert model_calls == [], "a request that cannot be parsed never reaches the model"


@pytest.mark.parametrize(
    "request_kwargs, message",
    [
        (dict(json={"m": 1}), 'the JSON body has no key "n"; send {"n": ...}'),
        (dict(json=[1, 2]), 'send a JSON object with the key "n"'),
        (dict(json="n"), 'send a JSON object with the key "n"'),
        (dict(data={"m": "1"}), 'send the input as JSON {"n": ...}, as the form field "n", or as the file "n"'),
        (dict(data="{", content_type="application/json"), "the body is not valid JSON"),
        (
            dict(data=b"n=1", content_type="multipart/form-data"),
            "the multipart body has no boundary: send Content-Type: multipart/form-data; boundary=...",
        ),
    ],
)
def test_a_missing_field_or_a_body_of_the_wrong_shape_is_a_400(make_app, request_kwargs, message):
    app, streamer = make_app()
    streamer.add_batched_route("/double", model=double, field="n")
    error = error_of(app.test_client().post("/double", **request_kwargs), 400)
    assert message in error["message"]


def test_hooks_parse_a_file_upload_and_shape_the_response(make_app):
    """The image-classification case: the input is an uploaded file, and the
    route answers with a response of its own making."""
    seen = []

    def parse(request):
        upload = request.files.get("file")
        if upload is None:
            raise InvalidInput('upload the image as the form field "file"')
        return {"name": upload.filename, "data": upload.read().decode("latin-1")}

    def classify(batch):
        seen.append([item["name"] for item in batch])
        return [
            {"label": "cat" if item["data"].startswith("CAT") else "dog", "bytes": len(item["data"])} for item in batch
        ]

    def respond(output):
        response = jsonify(prediction=output["label"], size=output["bytes"])
        response.headers["X-Model"] = "classify"
        return response, 201

    app, streamer = make_app()
    streamer.add_batched_route("/classify", model=classify, parse=parse, respond=respond)
    client = app.test_client()
    response = client.post(
        "/classify", data={"file": (io.BytesIO(b"CAT\x00\xff" * 10), "kitty.png")}, content_type="multipart/form-data"
    )
    assert response.status_code == 201 and response.headers["X-Model"] == "classify"
    assert response.get_json() == {"prediction": "cat", "size": 50}
    assert seen == [["kitty.png"]]
    error = error_of(client.post("/classify", data={"other": "x"}), 400)
    assert error["type"] == "InvalidInput" and error["message"] == 'upload the image as the form field "file"'
    assert seen == [["kitty.png"]]


def test_a_respond_hook_may_return_any_flask_response(make_app):
    app, streamer = make_app()
    streamer.add_batched_route("/text", "text", double, respond=lambda out: Response(str(out), mimetype="text/plain"))
    response = app.test_client().post("/text", json="ab")
    assert response.status_code == 200 and response.mimetype == "text/plain" and response.data == b"abab"


@pytest.mark.parametrize(
    "error, message",
    [
        (ValueError("not a number: 'x'"), "the request could not be parsed: not a number: 'x'"),
        (KeyError("image"), "the request could not be parsed: 'image'"),
        (TypeError("expected bytes"), "the request could not be parsed: expected bytes"),
    ],
)
def test_a_parse_hook_that_raises_a_value_error_gives_a_400(make_app, error, message):
    def parse(request):
        raise error

    app, streamer = make_app()
    streamer.add_batched_route("/p", "p", double, parse=parse)
    body = error_of(app.test_client().post("/p", json=1), 400)
    assert body["type"] == "InvalidInput" and body["message"] == message


def test_a_parse_hook_reading_a_missing_file_gives_a_json_400(make_app):
    """Werkzeug's ``request.files["file"]`` raises BadRequest, which is
    answered as JSON like every other parse error, not as Flask's HTML page."""
    app, streamer = make_app()
    streamer.add_batched_route("/upload", "upload", double, parse=lambda request: request.files["file"].read())
    error_of(app.test_client().post("/upload", data={"x": "1"}), 400)


def test_a_parse_hook_sees_the_url_variables(make_app):
    app, streamer = make_app()
    streamer.add_batched_route("/items/<int:item>", "item", sized, parse=lambda request: request.view_args["item"] + 1)
    assert app.test_client().post("/items/41").get_json() == {"x": 42, "n": 1}


def test_numpy_and_tuple_results_are_answered_as_json(make_app):
    app, streamer = make_app()
    streamer.add_batched_route("/np", "np", lambda batch: [np.arange(3, dtype=np.float32) * x for x in batch])
    streamer.add_batched_route("/scalar", "scalar", lambda batch: [np.int64(x) for x in batch])
    streamer.add_batched_route("/tuple", "tuple", lambda batch: [(x, {"k": (1, 2)}) for x in batch])
    client = app.test_client()
    assert client.post("/np", json=2).get_json() == [0.0, 2.0, 4.0]
    assert client.post("/scalar", json=7).get_json() == 7
    assert client.post("/tuple", json="a").get_json() == ["a", {"k": [1, 2]}]


def test_a_model_error_is_a_500_for_its_input_only_even_inside_one_batch(make_app, gated, pool, caplog):
    """Hold the model so that three requests queue into one batch, one of
    them an input the model raises for: that one gets a 500 (the error
    logged under the id it carries), the others their results."""
    app, streamer = make_app({"STREAMER_BATCH_SIZE": 8, "STREAMER_MAX_LATENCY": 0.01})
    streamer.add_batched_route("/gated", "gated", gated)
    held, futures = queue_behind_hold(pool, app, "/gated", "gated", gated, ["a", "boom", "b"])
    gated.release()
    assert held.result(10).get_json() == "ok:hold"
    first, boom, last = (f.result(10) for f in futures)
    assert first.get_json() == "ok:a" and last.get_json() == "ok:b"
    failure = failure_behind(error_of(boom, 500), caplog.records)
    assert (type(failure), str(failure)) == (ValueError, "the model cannot take 'boom'")
    assert sorted(gated.batches[1]) == ["a", "b", "boom"], "the three should have been one batch"
    # The model keeps serving.
    assert app.test_client().post("/gated", json="c").get_json() == "ok:c"


def test_the_traceback_is_shown_only_in_debug_mode(make_app):
    app, streamer = make_app()
    streamer.add_batched_route("/boom", model=fail_on_boom)
    client = app.test_client()
    error = error_of(client.post("/boom", json="boom"), 500)
    assert "traceback" not in error and "fail_on_boom" not in str(error) and "boom" not in error["message"]
    app.debug = True
    error = error_of(client.post("/boom", json="boom"), 500)
    assert "ValueError: the model cannot take 'boom'" in error["traceback"]
    assert "fail_on_boom" in error["traceback"], "the traceback should reach into the model"
    assert error["message"] == "the model cannot take 'boom'"


def test_a_result_that_cannot_be_json_encoded_is_a_json_500(make_app, caplog):
    """ "Always a JSON body": a model whose output JSON cannot carry (a set,
    bytes) gets a JSON 500, not Flask's HTML error page, the problem named in
    the log line of its id."""
    app, streamer = make_app()
    streamer.add_batched_route("/set", "set_result", lambda batch: [{x} for x in batch])
    streamer.add_batched_route("/bytes", "bytes_result", lambda batch: [str(x).encode() for x in batch])
    client = app.test_client()
    for path in ("/set", "/bytes"):
        failure = str(failure_behind(error_of(client.post(path, json=1), 500), caplog.records))
        assert "JSON" in failure or "serializable" in failure, failure


def test_a_call_that_times_out_is_a_504_and_its_input_never_runs(make_app, gated, pool):
    app, streamer = make_app({"STREAMER_BATCH_SIZE": 8})
    streamer.add_batched_route("/gated", "gated", gated, timeout=0.4)
    held = pool.submit(lambda: app.test_client().post("/gated", json="hold"))
    assert gated.entered.wait(10)
    started = time.monotonic()
    late = app.test_client().post("/gated", json="late")  # queued behind the held batch
    elapsed = time.monotonic() - started
    error = error_of(late, 504)
    assert error["type"] == "StreamerTimeoutError" and "0.4" in error["message"]
    assert 0.3 <= elapsed < 2.0, f"answered after {elapsed:.2f}s for a 0.4s timeout"
    assert error_of(held.result(5), 504)["type"] == "StreamerTimeoutError"
    gated.release()
    assert app.test_client().post("/gated", json="after").get_json() == "ok:after"
    assert "late" not in gated.seen(), "an input whose call timed out must not reach the model"


def test_a_full_queue_is_a_503_with_retry_after_at_once(make_app, gated, pool):
    """Refused while the model still holds the batch before it: a call that
    waited for room would wait its whole timeout (20 s). The bound leaves a
    loaded machine's scheduler its seconds (CI at a load of 8 took over 0.5)."""
    app, streamer = make_app({"STREAMER_MAX_QUEUE": 1, "STREAMER_BATCH_SIZE": 8, "STREAMER_TIMEOUT": 20})
    streamer.add_batched_route("/gated", "gated", gated)
    held, [waiting] = queue_behind_hold(pool, app, "/gated", "gated", gated, ["waiting"])
    started = time.monotonic()
    refused = app.test_client().post("/gated", json="one too many")
    assert time.monotonic() - started < 5, "a full queue must refuse at once, not wait for room"
    error = error_of(refused, 503)
    assert error["type"] == "QueueFullError" and "max_queue is 1" in error["message"]
    assert refused.headers["Retry-After"] == "1"
    gated.release()
    assert held.result(10).get_json() == "ok:hold"
    assert waiting.result(10).get_json() == "ok:waiting"
    assert "one too many" not in gated.seen()
    assert app.test_client().post("/gated", json="room again").get_json() == "ok:room again"


@pytest.mark.parametrize("backend", ["process", "thread"])
def test_no_worker_that_can_start_is_a_503_with_retry_after(make_app, backend):
    """A ManagedModel whose init_model raises: the first request waits only
    for the model to fail to load (in spawned workers, or in this process
    for the thread backend); later ones are refused at once."""
    app, streamer = make_app({"STREAMER_BACKEND": backend, "STREAMER_TIMEOUT": 60})
    streamer.add_batched_route("/broken", model=BrokenModel)
    client = app.test_client()
    started = time.monotonic()
    first = client.post("/broken", json=1)
    assert time.monotonic() - started < 30
    error = error_of(first, 503)
    assert error["type"] == "WorkerStartError" and "weights.bin not found" in error["message"]
    assert first.headers["Retry-After"] == "5"
    assert "traceback" not in error
    started = time.monotonic()
    again = client.post("/broken", json=2)
    assert time.monotonic() - started < 1.0
    assert error_of(again, 503)["type"] == "WorkerStartError" and again.headers["Retry-After"] == "5"


def test_a_run_of_503s_is_logged_once_then_counted(make_app, caplog, monkeypatch):
    """While a model cannot load every request is refused the same way: the
    log gets one line for it, and the next one, an interval later, says how
    many more there were, rather than a line per request."""
    from streamer_core.web import http

    monkeypatch.setattr(http, "_unavailable_seen", {})
    monkeypatch.setattr(http, "UNAVAILABLE_LOG_INTERVAL_S", 600.0)  # however slow the machine
    app, streamer = make_app({"STREAMER_BACKEND": "thread"})
    streamer.add_batched_route("/broken", model=BrokenModel)
    client = app.test_client()
    caplog.set_level(logging.WARNING)

    def lines() -> list:
        return [r.getMessage() for r in caplog.records if "answered 503" in r.getMessage()]

    for n in range(20):
        assert client.post("/broken", json=n).status_code == 503
    assert len(lines()) == 1 and "BrokenModel" in lines()[0] and "weights.bin not found" in lines()[0], lines()
    monkeypatch.setattr(http, "UNAVAILABLE_LOG_INTERVAL_S", 0.0)
    assert client.post("/broken", json=20).status_code == 503
    assert len(lines()) == 2 and "(19 more like it since the last such line)" in lines()[1], lines()


def test_a_redis_that_does_not_answer_is_a_503_within_seconds(make_app):
    app, streamer = make_app(
        {
            "STREAMER_BACKEND": "redis",
            "STREAMER_REDIS_URL": f"redis://127.0.0.1:{free_port()}/0",  # nothing listens there
            "STREAMER_TIMEOUT": 60,
        }
    )
    streamer.add_batched_route("/double", model=double)
    started = time.monotonic()
    response = app.test_client().post("/double", json=1)
    assert time.monotonic() - started < 5.0, "a dead broker must not hold the request until the timeout"
    error = error_of(response, 503)
    assert error["type"] == "BrokerUnavailableError" and "Redis cannot be reached" in error["message"]
    assert response.headers["Retry-After"] == "5"


def test_a_closed_streamer_call_in_flight_is_a_503(make_app, gated, pool):
    """Closing while a call waits: the call fails with a JSON 503 rather than hanging."""
    app, streamer = make_app({"STREAMER_BATCH_SIZE": 8})
    streamer.add_batched_route("/gated", "gated", gated)
    held, [waiting] = queue_behind_hold(pool, app, "/gated", "gated", gated, ["waiting"])
    streamer.close(app, timeout=0.2)  # the model is still held: the queued call cannot finish
    error = error_of(waiting.result(10), 503)
    assert error["type"] == "StreamerClosedError" and waiting.result().headers["Retry-After"] == "5"
    gated.release()
    held.result(10)


def test_an_input_the_parse_hook_made_that_cannot_reach_a_worker_is_a_json_500(make_app, caplog):
    """A client's JSON always crosses to a worker; a value the app's parse
    hook made that cannot (here a lock, which cannot be pickled) is the
    server's fault: 500, logged, never a 400."""
    app, streamer = make_app({"STREAMER_BACKEND": "process"})
    streamer.add_batched_route("/double", model=double, parse=lambda request: threading.Lock())
    failure = failure_behind(error_of(app.test_client().post("/double", json=1), 500), caplog.records)
    assert type(failure).__name__ == "SerializationError" and "lock" in str(failure), "logged for the operator"


def test_a_parse_hook_or_respond_hook_that_fails_unexpectedly_is_a_logged_json_500(make_app, caplog):
    """The same cycle as Django's: a hook's own bug is the server's fault,
    answered as JSON (not Flask's HTML page) and logged with its traceback;
    the model never sees an input of a parse hook that failed."""
    calls = []

    def parse(request):
        raise RuntimeError("the hook's bug")

    def respond(output):
        raise LookupError("the respond hook's bug")

    app, streamer = make_app()
    streamer.add_batched_route("/parse", "broken_parse", lambda batch: calls.append(batch) or batch, parse=parse)
    streamer.add_batched_route("/respond", "broken_respond", double, respond=respond)
    client = app.test_client()
    parse_error = error_of(client.post("/parse", json=1), 500)
    failure = failure_behind(parse_error, caplog.records)
    assert (type(failure), str(failure)) == (RuntimeError, "the hook's bug") and calls == []
    respond_error = error_of(client.post("/respond", json=1), 500)
    failure = failure_behind(respond_error, caplog.records)
    assert type(failure) is LookupError and "the respond hook's bug" in str(failure)
    failed = [r for r in caplog.records if r.levelname == "ERROR"]
    assert [r.getMessage() for r in failed] == [
        f"the batched route broken_parse failed (error id {parse_error['id']})",
        f"the batched route broken_respond failed (error id {respond_error['id']})",
    ]
