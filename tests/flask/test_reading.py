"""How a batched route reads a request's content type, length and transfer
encoding: from the WSGI environment, as werkzeug's own request properties
would give them, unless the app's request class reads them its own way."""

from __future__ import annotations

from typing import Any, Dict, Iterator, List, Optional

import pytest
from flask import Flask, Request
from hypothesis import example, given, settings
from hypothesis import strategies as st

from flask_streamer import FlaskStreamer
from flask_streamer.reading import FlaskBody
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
