"""A batched route's JSON answer (``JsonAnswer``): Flask's response, sent to
the WSGI server as werkzeug sends it, byte for byte, whatever the app's
hooks made of it; an app's own response class is kept."""

from __future__ import annotations

from typing import Any, Dict, Iterator, List, Tuple

import pytest
from flask import Flask, Response, request
from hypothesis import example, given, settings
from hypothesis import strategies as st
from werkzeug.test import EnvironBuilder

from flask_streamer import FlaskStreamer
from flask_streamer.answer import JsonAnswer
from tests.flask.conftest import close_streamers
from tests.helpers import needs_shortcut


def _sent(response: Response, method: str) -> Tuple[str, List[Tuple[str, str]], bytes]:
    """What a WSGI server gets from ``response``: status, headers, the body."""
    environ = EnvironBuilder(method=method, path="/embed", base_url="http://example.com/app").get_environ()
    started: Dict[str, Any] = {}

    def start_response(status: str, headers: List[Tuple[str, str]], exc_info: Any = None) -> None:
        started.update(status=status, headers=list(headers))

    body = response(environ, start_response)
    data = b"".join(body)
    getattr(body, "close", lambda: None)()  # as a server closes what it sent
    return started["status"], started["headers"], data


_bodies = st.one_of(
    st.binary(max_size=40),
    st.text(max_size=10),
    st.lists(st.binary(max_size=8), max_size=3),
)
_headers = st.lists(
    st.sampled_from(
        [
            ("Location", "/next"),
            ("location", "other?q=é"),
            ("Content-Location", "/here"),
            ("X-Model", "embed"),
            ("Cache-Control", "no-store"),
        ]
    ),
    max_size=3,
)


@settings(max_examples=300, deadline=None)
@given(
    body=_bodies,
    status=st.sampled_from([200, 200, 200, 201, 204, 304, 404, 500]),
    method=st.sampled_from(["POST", "POST", "GET", "HEAD"]),
    headers=_headers,
    drop_length=st.booleans(),
    set_length=st.booleans(),
    passthrough=st.booleans(),
    on_close=st.booleans(),
    raw=st.one_of(st.none(), st.lists(st.one_of(st.binary(max_size=4), st.text(max_size=4)), max_size=2)),
)
@example(b"{}", 200, "POST", [], False, True, False, False, ["é"])  # a hook's text body: encoded
def test_sent_as_werkzeug_sends_it(body, status, method, headers, drop_length, set_length, passthrough, on_close, raw):
    made: List[Response] = []
    closed: List[Any] = []
    for kind in (JsonAnswer, Response):
        response = kind(body, status=status, mimetype="application/json")
        response.automatically_set_content_length = set_length
        for key, value in headers:
            response.headers.add(key, value)
        if drop_length:
            response.headers.remove("Content-Length")
        # A body passed through is sent as it is: bytes only (a server refuses text).
        held = (body if isinstance(body, list) else [body]) if raw is None else raw
        response.direct_passthrough = passthrough and all(isinstance(x, bytes) for x in held)
        if on_close:
            response.call_on_close(lambda name=kind.__name__: closed.append(name))
        if raw is not None:  # a hook's own body, set as werkzeug holds one
            response.response = list(raw)
        made.append(response)
    assert _sent(made[0], method) == _sent(made[1], method)
    assert closed.count("JsonAnswer") == closed.count("Response")


def test_close_callbacks_run_as_werkzeug_runs_them():
    ran: List[str] = []
    response = JsonAnswer(b"[1]", mimetype="application/json")
    response.call_on_close(lambda: ran.append("closed"))
    environ = EnvironBuilder(method="POST", path="/embed").get_environ()
    body = response(environ, lambda status, headers, exc_info=None: None)
    assert b"".join(body) == b"[1]" and ran == []
    body.close()  # type: ignore[attr-defined]
    assert ran == ["closed"]


def embed(batch: List[Any]) -> List[Any]:
    return [[len(x), 0.5] for x in batch]


@pytest.fixture
def app() -> Iterator[Flask]:
    app = Flask(__name__)
    FlaskStreamer(app).add_batched_route("/embed", "embed", embed, field="s")
    yield app
    close_streamers(app)


@needs_shortcut("flask-answer")
def test_the_route_answers_with_it_and_hooks_see_flasks_response(app):
    seen: List[Any] = []

    @app.after_request
    def look(response: Response) -> Response:
        seen.append(response)
        return response

    answer = app.test_client().post("/embed", json={"s": "abc"})
    assert answer.status_code == 200 and answer.get_json() == [3, 0.5]
    assert answer.headers["Content-Type"] == "application/json"
    assert answer.headers["Content-Length"] == str(len(answer.get_data()))
    assert type(seen[0]) is JsonAnswer and isinstance(seen[0], Response)


def test_what_a_hook_changes_is_sent(app):
    ran: List[str] = []

    @app.after_request
    def change(response: Response) -> Response:
        if request.headers.get("X-Change") == "locate":
            response.headers["Location"] = "/embed/é"
            response.call_on_close(lambda: ran.append("closed"))
        elif request.headers.get("X-Change") == "empty":
            response.status_code = 204
        return response

    client = app.test_client()
    answer = client.post("/embed", json={"s": "abcd"}, headers={"X-Change": "locate"})
    assert answer.status_code == 200 and answer.get_json() == [4, 0.5]
    assert answer.headers["Location"] == "/embed/%C3%A9"  # made a URI, as werkzeug does
    answer.close()
    assert ran == ["closed"]
    emptied = client.post("/embed", json={"s": "abcd"}, headers={"X-Change": "empty"})
    assert emptied.status_code == 204 and emptied.get_data() == b"" and "Content-Length" not in emptied.headers


def test_an_apps_own_response_class_is_kept():
    class Tagged(Response):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.headers["X-Tag"] = "made"

    app = Flask(__name__)
    app.response_class = Tagged
    seen: List[Any] = []
    app.after_request(lambda response: seen.append((type(response), response.headers.get("X-Tag"))) or response)
    FlaskStreamer(app).add_batched_route("/embed", "embed", embed, field="s")
    try:
        assert app.test_client().post("/embed", json={"s": "ab"}).get_json() == [2, 0.5]
        # Made by the app's class (its __init__ ran), not converted to it after.
        assert seen == [(Tagged, "made")]
    finally:
        close_streamers(app)
