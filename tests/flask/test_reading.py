"""How a batched route reads a request's content type, length and transfer
encoding: from the WSGI environment, as werkzeug's own request properties
would give them, unless the app's request class reads them its own way."""

from __future__ import annotations

import io
from typing import Any, Dict, Iterator, List, Optional

import pytest
import werkzeug.exceptions
from flask import Flask, Request
from hypothesis import example, given, settings
from hypothesis import strategies as st

from flask_streamer import FlaskStreamer, request_item
from flask_streamer.reading import FlaskBody, body_of, limit_request_body
from streamer_core.errors import ClientDisconnected
from tests.flask.conftest import close_streamers


class _ThroughProperties(Request):
    """werkzeug's request, read through its properties (an override that
    changes nothing but makes FlaskBody ask them)."""

    @property
    def mimetype(self) -> str:
        return super().mimetype


# Header values as clients send them, odd ones included: parameters, case,
# spaces and tabs, several codings, numbers that do not parse.
_types = st.one_of(
    st.none(),
    st.sampled_from(["", "application/json", "Application/JSON ; charset=utf-8", " \ttext/plain\t;a=b", ";x=1"]),
    st.text(st.sampled_from("abJ/;= \t-+x"), max_size=20),
)
_lengths = st.one_of(
    st.none(), st.sampled_from(["", "0", "12", "-3", "+4", "1_0", " 7", "x"]), st.text("0123456789 ", max_size=6)
)
_codings = st.one_of(
    st.none(),
    st.sampled_from(["", "chunked", "Chunked", "gzip, chunked", "gzip", "identity", '"chunked"', "chunkedgzip"]),
    st.text(st.sampled_from("chunkedCHUNK ,gzip"), max_size=16),
)


def _environ(content_type: Optional[str], length: Optional[str], coding: Optional[str]) -> Dict[str, Any]:
    environ: Dict[str, Any] = {"REQUEST_METHOD": "POST", "wsgi.input": None}
    for key, value in (("CONTENT_TYPE", content_type), ("CONTENT_LENGTH", length), ("HTTP_TRANSFER_ENCODING", coding)):
        if value is not None:
            environ[key] = value
    return environ


@settings(max_examples=400, deadline=None)
@given(_types, _lengths, _codings)
@example("application/json", "12", "chunkedgzip")  # not chunked to werkzeug: its length counts
def test_read_from_the_environment_as_werkzeugs_properties_read_it(content_type, length, coding):
    environ = _environ(content_type, length, coding)
    plain, asked = FlaskBody(Request(environ)), FlaskBody(_ThroughProperties(environ))
    expected = (asked.media_type, asked.content_length, asked.chunked)
    assert (plain.media_type, plain.content_length, plain.chunked) == expected
    # And those are werkzeug's own answers; a body is read as chunks where
    # werkzeug knows no length and the client said it sends chunks.
    request = Request(environ)
    assert expected[:2] == (request.mimetype, request.content_length)
    assert expected[2] == (request.content_length is None and "chunked" in (coding or "").lower())


def describe(batch: List[Any]) -> List[Any]:
    return [{"type": type(x).__name__, "value": x} for x in batch]


class _LegacyJson(Request):
    """An app's request class that takes an old client's content type for JSON."""

    @property
    def mimetype(self) -> str:
        found = super().mimetype
        return "application/json" if found == "text/x-json" else found


@pytest.fixture
def legacy_app() -> Iterator[Flask]:
    app = Flask(__name__)
    app.request_class = _LegacyJson
    FlaskStreamer(app).add_batched_route("/describe", "describe", describe, field="s")
    yield app
    close_streamers(app)


def test_an_apps_own_request_class_is_read_through_its_properties(legacy_app):
    client = legacy_app.test_client()
    response = client.post("/describe", data=b'{"s": "hello"}', content_type="text/x-json")
    assert response.status_code == 200, response.get_data(as_text=True)
    assert response.get_json() == {"type": "str", "value": "hello"}
    # Its other content types are as werkzeug reads them.
    refused = client.post("/describe", data=b'{"s": "hello"}', content_type="text/csv")
    assert refused.status_code == 415, refused.get_data(as_text=True)


class _Capped(Request):
    """A request class whose length rule is its own (a proxy's, say)."""

    @property
    def content_length(self) -> Optional[int]:  # type: ignore[override]
        return 5000


class _OwnType(Request):
    """A request class that parses its content type its own way."""

    def _parse_content_type(self) -> None:
        self._parsed_content_type = ("application/json", {})


@pytest.mark.parametrize("kind", [_ThroughProperties, _Capped, _OwnType])
def test_each_property_a_request_class_overrides_is_asked(kind):
    environ = _environ("text/plain", "3", None)
    body = FlaskBody(kind(environ))
    request = kind(environ)
    assert (body.media_type, body.content_length) == (request.mimetype, request.content_length)


def test_an_apps_own_length_rule_decides_the_limit():
    app = Flask(__name__)
    app.request_class = _Capped
    FlaskStreamer(app).add_batched_route("/describe", "describe", describe, field="s", max_body_bytes=1000)
    try:
        refused = app.test_client().post("/describe", json={"s": "short"})
        assert refused.status_code == 413, refused.get_data(as_text=True)
    finally:
        close_streamers(app)


# -- the body, read from the server's stream ----------------------------------


class _Stream(io.BytesIO):
    """A server's body stream that ends at the body's end, as gunicorn's and
    gevent's do (they set ``wsgi.input_terminated``), and counts its reads;
    ``fail``: an error each read raises (the client left mid-body)."""

    def __init__(self, body: bytes, fail: Optional[BaseException] = None) -> None:
        super().__init__(body)
        self.reads = 0
        self.fail = fail

    def read(self, size: Optional[int] = -1) -> bytes:
        self.reads += 1
        if self.fail is not None:
            raise self.fail
        return super().read(size)

    def readinto(self, buffer: Any) -> int:
        self.reads += 1
        if self.fail is not None:
            raise self.fail
        return super().readinto(buffer)


def _served(body: bytes, content_type: str, kind: type = Request, **extra: Any) -> Request:
    environ = {
        "REQUEST_METHOD": "POST",
        "CONTENT_TYPE": content_type,
        "CONTENT_LENGTH": str(len(body)),
        "wsgi.input": _Stream(body),
        "wsgi.input_terminated": True,
        **extra,
    }
    made: Request = kind(environ)
    return made


_BODIES = [
    (b'{"s": "hello", "n": [1, 2]}', "application/json"),
    (b"s=hello&s=again&n=3", "application/x-www-form-urlencoded"),
    (b"", "application/json"),
]


@pytest.mark.parametrize(("body", "content_type"), _BODIES)
def test_a_body_read_by_the_route_reads_back_as_werkzeugs_own_read_leaves_it(body, content_type):
    ours, werkzeug = _served(body, content_type), _served(body, content_type)
    assert FlaskBody(ours).data() == body
    assert werkzeug.get_data(cache=True) == body
    # Read from the server's stream once: each of werkzeug's ways to the body
    # then gives what it gives after its own read.
    assert ours.environ["wsgi.input"].reads == 1
    assert ours.get_data() == werkzeug.get_data() == body
    assert ours.get_json(silent=True) == werkzeug.get_json(silent=True)
    assert ours.form.to_dict(flat=False) == werkzeug.form.to_dict(flat=False)
    assert ours.stream.read() == werkzeug.stream.read()


class _Gunzipping(Request):
    """An app's request class that reads its body its own way."""

    def get_data(self, cache: bool = True, as_text: bool = False, parse_form_data: bool = False) -> Any:
        return super().get_data(cache, as_text, parse_form_data).upper()


def test_an_apps_own_body_reading_is_asked():
    request = _served(b'{"s": "hello"}', "application/json", _Gunzipping)
    assert FlaskBody(request).data() == b'{"S": "HELLO"}'


def test_a_server_that_does_not_end_the_stream_is_read_to_the_bodys_length():
    request = _served(b'{"s": "hello"}', "application/json")
    stream = request.environ["wsgi.input"]
    stream.seek(0, io.SEEK_END)
    stream.write(b"GET / HTTP/1.1\r\n")  # the connection's next request, say
    stream.seek(0)
    del request.environ["wsgi.input_terminated"]
    assert FlaskBody(request).data() == b'{"s": "hello"}'


def _limited(limit: int) -> Flask:
    app = Flask(__name__)
    app.config["MAX_CONTENT_LENGTH"] = limit
    return app


def test_a_body_longer_than_the_apps_limit_is_refused_by_werkzeug_before_it_is_read():
    request = _served(b'{"s": "hello"}', "application/json")
    with _limited(5).app_context():
        with pytest.raises(werkzeug.exceptions.RequestEntityTooLarge):
            FlaskBody(request).data()
    assert request.environ["wsgi.input"].reads == 0


def test_a_body_as_long_as_the_apps_limit_is_read():
    request = _served(b'{"s": "hello"}', "application/json")
    with _limited(14).app_context():
        assert FlaskBody(request).data() == b'{"s": "hello"}'


@pytest.mark.parametrize("error", [OSError("unexpected end of file"), ValueError("closed file")])
def test_a_server_streams_error_is_the_client_leaving(error):
    request = _served(b'{"s": "hello"}', "application/json")
    request.environ["wsgi.input"].fail = error
    with pytest.raises(ClientDisconnected) as raised:
        FlaskBody(request).data()
    assert raised.value.__cause__ is error
    assert raised.value.status == 499


def test_a_body_read_before_is_not_read_again():
    request = _served(b'{"s": "hello"}', "application/json")
    assert request.get_data() == b'{"s": "hello"}'  # a before_request hook's
    reads = request.environ["wsgi.input"].reads
    assert FlaskBody(request).data() == b'{"s": "hello"}'
    assert request.environ["wsgi.input"].reads == reads


def test_a_requests_headers_are_read_once_for_its_body():
    app = Flask(__name__)
    with app.test_request_context():
        request = _served(b'{"s": "hello"}', "application/json")
        limit_request_body(request, app, 100)
        assert body_of(request) is body_of(request)
        # Another request over the same environment (a middleware's own) gets its own.
        other = Request(request.environ)
        assert body_of(other)._req is other


def test_a_stream_a_hook_put_in_place_is_read():
    request = _served(b'{"s": "hello"}', "application/json")
    request.stream = io.BytesIO(b'{"s": "unzipped"}')  # a before_request hook's, say
    assert FlaskBody(request).data() == b'{"s": "unzipped"}'
    assert request.environ["wsgi.input"].reads == 0


def test_a_shallow_request_is_refused_its_body_as_werkzeug_refuses_it():
    request = Request(_served(b'{"s": "hello"}', "application/json").environ, shallow=True)
    with pytest.raises(RuntimeError, match="shallow"):
        FlaskBody(request).data()


def test_a_body_is_read_once_for_each_of_its_readers():
    # A parse hook that asks request_item for two fields reads the body twice.
    request = _served(b'{"s": "hello"}', "application/json")
    assert FlaskBody(request).data() == FlaskBody(request).data() == b'{"s": "hello"}'
    assert request.environ["wsgi.input"].reads == 1


def test_an_apps_hooks_read_the_body_the_route_read():
    app = Flask(__name__)
    FlaskStreamer(app).add_batched_route("/describe", "describe", describe, field="s")
    seen: List[Any] = []

    @app.after_request
    def read_again(response: Any) -> Any:
        from flask import request

        seen.append((request.get_data(), request.get_json(), request.stream.read()))
        return response

    try:
        client = app.test_client()
        # As gunicorn and gevent serve it: the server ends the stream at the body's end.
        answer = client.post("/describe", json={"s": "hello"}, environ_base={"wsgi.input_terminated": True})
        assert answer.get_json() == {"type": "str", "value": "hello"}, answer.get_data(as_text=True)
        assert seen == [(b'{"s": "hello"}', {"s": "hello"}, b"")]
    finally:
        close_streamers(app)


def test_a_body_of_no_stated_length_is_read_as_werkzeug_reads_it_under_the_apps_limit():
    requests = [_served(b"x" * 40, "application/octet-stream") for _ in range(2)]
    for request in requests:
        del request.environ["CONTENT_LENGTH"]
    with _limited(10).app_context():
        assert FlaskBody(requests[0]).data() == requests[1].get_data()


def test_a_body_cut_short_is_the_client_leaving():
    request = _served(b'{"s": "hello"}', "application/json")
    request.environ["wsgi.input"] = _Stream(b'{"s": "he')
    with pytest.raises(ClientDisconnected):
        FlaskBody(request).data()


@pytest.mark.parametrize("hook", [False, True])
def test_a_routes_request_headers_are_read_once(monkeypatch, hook):
    made: List[Any] = []
    real = FlaskBody.__init__

    def counted(self: FlaskBody, req: Request) -> None:
        made.append(req)
        real(self, req)

    monkeypatch.setattr(FlaskBody, "__init__", counted)
    app = Flask(__name__)
    parse = (lambda req: request_item("s")) if hook else None
    FlaskStreamer(app).add_batched_route("/describe", "describe", describe, field="s", parse=parse)
    try:
        answer = app.test_client().post("/describe", json={"s": "hello"})
        assert answer.get_json() == {"type": "str", "value": "hello"}, answer.get_data(as_text=True)
        assert len(made) == 1
    finally:
        close_streamers(app)
