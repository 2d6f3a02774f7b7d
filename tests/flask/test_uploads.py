"""Uploaded files as model inputs: a route's ``field`` names a JSON key, a
form field or a file, and a file arrives as bytes; a body over
``max_body_bytes`` (``STREAMER_MAX_BODY_BYTES``, 10 MiB by default) gets a
JSON 413, by its Content-Length or, sent in chunks, as it is read."""

from __future__ import annotations

import io
import os
from typing import Any, Iterator, List

import pytest
from flask import Flask, Request

from flask_streamer import ConfigurationError, FlaskStreamer, request_item
from tests.flask.conftest import close_streamers, error_of
from tests.flask.test_example_classify import upload

PAYLOAD = os.urandom(300_000) + b"\x00\xff"


def describe(batch: List[Any]) -> List[Any]:
    return [
        {"type": type(x).__name__, "length": len(x), "head": x[:8].hex() if isinstance(x, bytes) else x} for x in batch
    ]


def make_app(**config: Any) -> Flask:
    app = Flask(__name__)
    app.config.update(config)
    streamer = FlaskStreamer()
    streamer.add_batched_route("/upload", "upload", describe, field="file")
    streamer.add_batched_route("/small", "small", describe, field="file", max_body_bytes=1000)
    streamer.add_batched_route("/hooked", "hooked", describe, parse=lambda req: request_item("file")[::-1])
    streamer.init_app(app)
    return app


@pytest.fixture
def app() -> Iterator[Flask]:
    app = make_app()
    yield app
    close_streamers(app)


def test_a_file_arrives_as_its_bytes(app):
    client = app.test_client()
    response = client.post("/upload", **upload(PAYLOAD, "data.bin"))
    assert response.status_code == 200, response.get_data(as_text=True)
    assert response.get_json() == {"type": "bytes", "length": len(PAYLOAD), "head": PAYLOAD[:8].hex()}
    assert client.post("/upload", data={"file": "typed in"}).get_json()["type"] == "str"  # a form field comes first
    # A parse hook reads it the same way, and makes of it what the model takes.
    assert client.post("/hooked", **upload(b"abc")).get_json()["head"] == b"cba".hex()


# werkzeug, stopped mid-file by the limit, leaves the part it spooled to the
# garbage collector, which warns that it was not closed.
@pytest.mark.filterwarnings("ignore:Exception ignored in.*SpooledTemporaryFile:pytest.PytestUnraisableExceptionWarning")
def test_bodies_over_the_limit_are_a_413(app):
    client = app.test_client()
    error = error_of(client.post("/small", **upload(b"x" * 2000)), 413)
    assert error["type"] == "PayloadTooLarge" and "1000" in error["message"]
    assert client.post("/small", **upload(b"x" * 100)).status_code == 200
    # Sent in chunks, with no Content-Length: werkzeug stops reading at the limit.
    chunked = upload(b"x" * 5000)
    response = client.post(
        "/small",
        input_stream=io.BytesIO(chunked["data"]),
        content_type=chunked["content_type"],
        headers={"Transfer-Encoding": "chunked"},
        environ_overrides={"wsgi.input_terminated": True},
    )
    error = error_of(response, 413)
    assert error["type"] == "PayloadTooLarge", "the project's 413, not werkzeug's wording"


def test_flasks_own_max_content_length_holds_where_it_is_lower():
    """The README: Flask's ``MAX_CONTENT_LENGTH`` still holds when lower
    than the streamer's limit, the route's own included."""
    app = make_app(MAX_CONTENT_LENGTH=600)
    try:
        client = app.test_client()
        error = error_of(client.post("/small", **upload(b"x" * 800)), 413)  # under the route's 1,000
        assert error["type"] == "PayloadTooLarge"
        assert error_of(client.post("/upload", json={"file": "x" * 700}), 413)["type"] == "PayloadTooLarge"
        assert client.post("/small", **upload(b"x" * 100)).status_code == 200
    finally:
        close_streamers(app)


def test_the_lower_of_the_two_limits_is_the_one_a_413_names():
    """With ``MAX_CONTENT_LENGTH`` under the route's limit, a body over it is
    refused by the project's own check, which says its size and the limit."""
    app = make_app(MAX_CONTENT_LENGTH=20)
    try:
        body = b'{"file": "' + b"x" * 97 + b'"}'
        error = error_of(app.test_client().post("/upload", data=body, content_type="application/json"), 413)
        assert error["type"] == "PayloadTooLarge"
        assert f"{len(body)} bytes" in error["message"] and "the 20 this endpoint takes" in error["message"], error
    finally:
        close_streamers(app)


def test_a_body_in_chunks_over_the_apps_own_limit_is_a_413_not_unreadable():
    """werkzeug refuses a body in chunks past ``MAX_CONTENT_LENGTH`` as it reads
    it: its own 413, answered as the project's, not taken for a malformed chunk."""
    app = make_app(MAX_CONTENT_LENGTH=20)
    try:
        body = b'{"file": "' + b"x" * 97 + b'"}'
        answer = app.test_client().post(
            "/upload",
            input_stream=io.BytesIO(body),
            content_type="application/json",
            headers={"Transfer-Encoding": "chunked"},
            environ_base={"wsgi.input_terminated": True},  # as gunicorn and gevent give a body they decoded
        )
        assert error_of(answer, 413)["type"] == "PayloadTooLarge"
        fits = app.test_client().post(
            "/upload",
            input_stream=io.BytesIO(b'{"file": "x"}'),
            content_type="application/json",
            headers={"Transfer-Encoding": "chunked"},
            environ_base={"wsgi.input_terminated": True},
        )
        assert fits.status_code == 200, fits.get_data(as_text=True)
    finally:
        close_streamers(app)


def test_the_app_wide_limit_and_its_checks():
    app = make_app(STREAMER_MAX_BODY_BYTES=100_000)
    try:
        client = app.test_client()
        assert error_of(client.post("/upload", **upload(PAYLOAD)), 413)["type"] == "PayloadTooLarge"
        assert error_of(client.post("/upload", json={"file": "x" * 200_000}), 413)["status"] == 413
        assert client.post("/small", **upload(b"x" * 500)).status_code == 200  # the route's own limit holds there
    finally:
        close_streamers(app)
    for bad in (0, -1, "10MB", 2.5):
        with pytest.raises(ConfigurationError, match="STREAMER_MAX_BODY_BYTES must be a whole number of bytes"):
            make_app(STREAMER_MAX_BODY_BYTES=bad)
    with pytest.raises(ValueError, match="max_body_bytes of the batched route '/x'"):
        FlaskStreamer().add_batched_route("/x", "x", describe, max_body_bytes=0)


def test_empty_and_missing_files_are_a_400(app):
    client = app.test_client()
    assert "is empty" in error_of(client.post("/upload", **upload(b"")), 400)["message"]
    assert 'the file "file"' in error_of(client.post("/upload", **upload(b"x", field="other")), 400)["message"]


@pytest.mark.parametrize("server", ["dev", "gunicorn"])
def test_a_body_sent_in_chunks_is_read_whole_or_refused_never_cut(server):
    """Sent in chunks, with no Content-Length, a body over the limit is the
    project's 413 JSON on every route and server, a JSON body and a form
    alike; werkzeug alone cut both at the limit, and a form reached the
    model truncated (a 200 on the first 10 MiB). One within the limit is
    read whole."""
    from tests.flask.live import flask_dev_argv, free_port, gunicorn_argv, live_server
    from tests.helpers import post_chunked

    port = free_port()
    argv = flask_dev_argv(port) if server == "dev" else gunicorn_argv(port, "--threads", "4")
    with live_server(argv, port, {"STREAMER_MAX_BODY_BYTES": 20_000}):
        status, headers, body = post_chunked(port, "/predict", b'{"x": "' + b"a" * 15_000 + b'"}', "application/json")
        assert status == 200 and body["x"] == {"x": "a" * 15_000}, "read whole: the route takes the whole JSON body"
        for data, content_type in (
            (b'{"x": "' + b"a" * 50_000 + b'"}', "application/json"),
            (b"x=" + b"a" * 50_000, "application/x-www-form-urlencoded"),
            (b"x=" + b"a" * 19_999, "application/x-www-form-urlencoded"),  # 20,001 bytes: one past the limit
        ):
            status, headers, body = post_chunked(port, "/predict", data, content_type, chunk=4096)
            assert status == 413 and headers["content-type"] == "application/json", (status, body)
            assert body["error"]["type"] == "PayloadTooLarge" and "20000" in body["error"]["message"], body


def test_a_body_in_chunks_past_the_limit_is_refused_without_waiting_for_its_end():
    """A body sent in chunks is read no further than one byte past the
    limit: a client still sending (or one that never ends its body) gets its
    413 once it has gone past, not when it stops."""
    from tests.flask.live import free_port, gunicorn_argv, live_server
    from tests.helpers import post_chunked

    port = free_port()
    with live_server(gunicorn_argv(port, "--threads", "4"), port, {"STREAMER_MAX_BODY_BYTES": 20_000}):
        body = b'{"x": "' + b"a" * 30_000  # past the limit; its last chunk is never sent
        status, headers, answer = post_chunked(port, "/predict", body, "application/json", timeout=15, end=False)
        assert status == 413 and answer["error"]["type"] == "PayloadTooLarge", (status, answer)


def test_bodies_the_fast_path_declines_are_read_by_werkzeug(app):
    """A multipart body of the common shape is cut in C
    (``streamer_core.web.multipart``, tested against werkzeug's parser in
    tests/core/test_multipart.py); one of another shape (a preamble, bare LF
    line ends) is read by werkzeug, and werkzeug's limits still refuse."""
    client = app.test_client()
    for mend in (lambda body: b"a preamble\r\n" + body, lambda body: body.replace(b"\r\n", b"\n")):
        kwargs = upload(PAYLOAD[:1000].replace(b"\r", b"").replace(b"\n", b""))
        kwargs["data"] = mend(kwargs["data"])
        response = client.post("/upload", **kwargs)
        assert response.status_code == 200, response.get_data(as_text=True)
        assert response.get_json()["length"] == len(PAYLOAD[:1000].replace(b"\r", b"").replace(b"\n", b""))
    # werkzeug's limits, as a request class sets them (Flask 3.1 also reads
    # them from MAX_FORM_PARTS and MAX_FORM_MEMORY_SIZE; 3.0 does not).
    app.request_class = type("Limited", (Request,), {"max_form_parts": 2})
    response = client.post("/upload", data={"a": "1", "b": "2", "file": (io.BytesIO(b"x"), "x.bin")})
    assert response.status_code == 413, response.get_data(as_text=True)
    app.request_class = type("Limited", (Request,), {"max_form_memory_size": 10})
    for size, status in ((11, 413), (10, 200)):  # a text field of a multipart form
        response = client.post("/upload", data={"file": "x" * size, "other": (io.BytesIO(b"y"), "y.bin")})
        assert response.status_code == status, response.get_data(as_text=True)
