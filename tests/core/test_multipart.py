"""The multipart fast path (``streamer_core.web.multipart``) answers what
werkzeug's and Django's parsers answer for every body of the common shape,
and declines (``None``) the rest, which those parsers then read.

The bodies are made by real encoders: werkzeug's (its test client's), the
layout curl sends (checked against a real curl below), and Django's test
client's (in tests/django/test_uploads.py)."""

from __future__ import annotations

import io
import shutil
import socket
import subprocess
import threading
from typing import Dict, List, Tuple

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from werkzeug.datastructures import Headers
from werkzeug.formparser import parse_form_data
from werkzeug.sansio.multipart import Data, Epilogue, Field, File, MultipartEncoder, Preamble

from streamer_core.web.multipart import Form, parse_form

# Field names as clients send them (a quote or line break is percent-encoded
# by browsers, so never appears); values of any text; files of any bytes,
# including what looks like a boundary, CRLFs and dashes.
names = st.text(st.characters(blacklist_characters='"\\\r\n', blacklist_categories=("Cs",)), min_size=1, max_size=12)
texts = st.text(st.characters(blacklist_categories=("Cs",)), max_size=40)
tricky = st.sampled_from([b"\r\n", b"--", b"\r\n--", b"\r\n\r\n", b"\n", b"\r", b"--B--"])
payloads = st.lists(st.one_of(st.binary(max_size=64), tricky), max_size=6).map(b"".join)
parts = st.lists(
    st.tuples(names, st.one_of(texts.map(lambda t: ("text", t)), st.tuples(st.just("file"), payloads, names))),
    min_size=1,
    max_size=5,
)


def werkzeug_body(form: List[Tuple[str, tuple]], boundary: str = "WerkzeugFormPart_1.5") -> Tuple[str, bytes]:
    """The body werkzeug's multipart encoder writes (its test client's)."""
    encoder = MultipartEncoder(boundary.encode())
    out = encoder.send_event(Preamble(data=b""))
    for name, part in form:
        if part[0] == "text":
            out += encoder.send_event(Field(name=name, headers=Headers()))
            out += encoder.send_event(Data(data=part[1].encode(), more_data=False))
        else:
            headers = Headers([("Content-Type", "image/jpeg")])
            out += encoder.send_event(File(name=name, filename=part[2], headers=headers))
            out += encoder.send_event(Data(data=part[1], more_data=False))
    return boundary, out + encoder.send_event(Epilogue(data=b""))


def curl_body(form: List[Tuple[str, tuple]], boundary: str = "------------------------eb707dc4f34ac545") -> bytes:
    """The layout of ``curl -F``: no preamble, a Content-Type for files only."""
    out = b""
    for name, part in form:
        out += b'--%s\r\nContent-Disposition: form-data; name="%s"' % (boundary.encode(), name.encode())
        if part[0] == "text":
            out += b"\r\n\r\n" + part[1].encode()
        else:
            out += b'; filename="%s"\r\nContent-Type: application/octet-stream\r\n\r\n' % part[2].encode() + part[1]
        out += b"\r\n"
    return out + b"--%s--\r\n" % boundary.encode()


def by_werkzeug(body: bytes, boundary: str) -> Form:
    environ = {
        "REQUEST_METHOD": "POST",
        "CONTENT_TYPE": f"multipart/form-data; boundary={boundary}",
        "CONTENT_LENGTH": str(len(body)),
        "wsgi.input": io.BytesIO(body),
    }
    _, fields, files = parse_form_data(environ, stream_factory=lambda *args, **kwargs: io.BytesIO())
    return Form({k: fields[k] for k in fields}, {k: files[k].read() for k in files})


@settings(max_examples=300, deadline=None)
@given(parts)
def test_what_werkzeug_reads_from_its_own_encoder(form):
    boundary, body = werkzeug_body(form)
    assert parse_form(body, boundary) == by_werkzeug(body, boundary)


@settings(max_examples=300, deadline=None)
@given(parts)
def test_what_werkzeug_reads_from_curls_layout(form):
    body = curl_body(form)
    boundary = "------------------------eb707dc4f34ac545"
    assert parse_form(body, boundary) == by_werkzeug(body, boundary)


@pytest.mark.skipif(shutil.which("curl") is None, reason="curl is not installed")
def test_the_layout_of_a_real_curl(tmp_path):
    """What curl sends is read here, and is the layout ``curl_body`` writes."""
    path = tmp_path / "upload.bin"  # curl types it application/octet-stream
    path.write_bytes(b"\xff\xd8\xff\r\n--x\r\n")
    listener = socket.create_server(("127.0.0.1", 0))
    received: Dict[str, bytes] = {}

    def serve() -> None:
        connection, _ = listener.accept()
        with connection:
            connection.settimeout(10)
            data = b""
            while b"\r\n\r\n" not in data:
                data += connection.recv(65536)
            head, _, body = data.partition(b"\r\n\r\n")
            length = int(
                next(
                    v for k, v in (h.split(b": ", 1) for h in head.split(b"\r\n")[1:]) if k.lower() == b"content-length"
                )
            )
            while len(body) < length:
                body += connection.recv(65536)
            received["head"], received["body"] = head, body
            connection.sendall(b"HTTP/1.1 204 No Content\r\nConnection: close\r\n\r\n")

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    port = listener.getsockname()[1]
    subprocess.run(
        ["curl", "-s", "-m", "10", "-F", f"file=@{path}", "-F", "s=a b", f"http://127.0.0.1:{port}/"], check=True
    )
    thread.join(10)
    listener.close()
    boundary = received["head"].split(b"boundary=")[1].split(b"\r\n")[0].decode()
    form = parse_form(received["body"], boundary)
    assert form == Form({"s": "a b"}, {"file": path.read_bytes()})
    assert received["body"] == curl_body(
        [("file", ("file", path.read_bytes(), "upload.bin")), ("s", ("text", "a b"))], boundary
    )


GOOD = curl_body([("file", ("file", b"abc", "a.jpg")), ("s", ("text", "x"))], "B")


@pytest.mark.parametrize(
    "body, why",
    [
        (GOOD.replace(b"\r\n", b"\n"), "bare LF line ends"),
        (b"a preamble\r\n" + GOOD, "a preamble with text"),
        (GOOD.replace(b"Content-Type:", b"Content-Transfer-Encoding: base64\r\nContent-Type:"), "another header"),
        (GOOD.replace(b'filename="a.jpg"', b"filename*=UTF-8''a.jpg"), "an RFC 2231 file name"),
        (GOOD.replace(b'name="s"', b'name="s\\"x"'), "an escaped quote"),
        (GOOD.replace(b"\r\nx\r\n", b"\r\n\xff\r\n"), "a text field that is not UTF-8"),
        (GOOD[:-10], "no close delimiter"),
        (GOOD.replace(b"--B--\r\n", b"--B-- \r\n"), "padding after the close delimiter"),
        (GOOD.replace(b"Content-Disposition: form-data; ", b""), "no Content-Disposition"),
    ],
)
def test_bodies_of_another_shape_are_left_to_the_framework(body: bytes, why: str):
    assert parse_form(body, "B") is None, why


def test_the_frameworks_limits_are_left_to_it():
    assert parse_form(GOOD, "B", max_parts=2) == Form({"s": "x"}, {"file": b"abc"})
    assert parse_form(GOOD, "B", max_parts=1) is None
    assert parse_form(GOOD, "B", max_field_bytes=1) == Form({"s": "x"}, {"file": b"abc"})
    assert parse_form(GOOD.replace(b"\r\nx\r\n", b"\r\nxx\r\n"), "B", max_field_bytes=1) is None
    assert parse_form(GOOD, "") is None
    assert parse_form(GOOD, "é") is None


def test_the_first_of_a_repeated_name_wins_as_in_a_multidict():
    body = curl_body(
        [("f", ("text", "1")), ("f", ("text", "2")), ("g", ("file", b"a", "x")), ("g", ("file", b"b", "y"))]
    )
    boundary = "------------------------eb707dc4f34ac545"
    assert parse_form(body, boundary) == by_werkzeug(body, boundary) == Form({"f": "1"}, {"g": b"a"})
