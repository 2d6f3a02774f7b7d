"""Uploaded files as model inputs: a view's ``field`` names a JSON key, a
form field or a file, and a file arrives as bytes; a body over
``STREAMER["MAX_BODY_BYTES"]`` is refused with a JSON 413 before it is read."""

from __future__ import annotations

import io
import os
from typing import Any

from django.core.checks import run_checks
from django.test import Client

from tests.flask.test_example_classify import upload

PAYLOAD = os.urandom(300_000) + b"\x00\xff"


def test_a_file_arrives_as_its_bytes(client: Client) -> None:
    response = client.post("/upload", **upload(PAYLOAD, "data.bin"))
    assert response.status_code == 200, response.content
    assert response.json() == {"type": "bytes", "length": len(PAYLOAD), "head": PAYLOAD[:8].hex()}
    # A form field of the same name still comes first, as text.
    response = client.post("/upload", {"file": "typed in"})
    assert response.json()["type"] == "str"


def test_a_body_over_the_limit_is_a_413(client: Client, settings: Any) -> None:
    settings.STREAMER = dict(settings.STREAMER, MAX_BODY_BYTES=100_000)
    response = client.post("/upload", **upload(PAYLOAD))
    assert response.status_code == 413 and response["Content-Type"] == "application/json", response.content
    error = response.json()["error"]
    assert error["type"] == "PayloadTooLarge" and "100000" in error["message"]
    assert client.post("/upload", **upload(PAYLOAD[:50_000])).status_code == 200
    settings.STREAMER = dict(settings.STREAMER, MAX_BODY_BYTES=None)
    assert client.post("/upload", **upload(PAYLOAD * 12)).status_code == 200  # 3.6 MB: no limit


def test_empty_or_missing_files_are_a_400(client: Client) -> None:
    for kwargs, message in ((upload(b""), "is empty"), (upload(b"x", field="other"), 'the file "file"')):
        response = client.post("/upload", **kwargs)
        assert response.status_code == 400, response.content
        assert message in response.json()["error"]["message"]


def test_a_bad_limit_is_a_system_check_error(settings: Any) -> None:
    for bad in (0, -5, "10MB", 1.5, True):
        settings.STREAMER = dict(settings.STREAMER, MAX_BODY_BYTES=bad)
        messages = [error.msg for error in run_checks() if error.id == "django_streamer.E009"]
        assert any("MAX_BODY_BYTES" in message and "at least 1" in message for message in messages), (bad, messages)
    settings.STREAMER = dict(
        settings.STREAMER, MODELS={"double": {"MODEL": "tests.django.batch_models.double", "MAX_BODY_BYTES": 5}}
    )
    messages = [error.msg for error in run_checks() if error.id == "django_streamer.E008"]
    assert any("set once for every model, at the top level" in message for message in messages), messages


def test_a_body_sent_in_chunks_is_read_whole_or_refused_under_gunicorn_and_411_under_runserver(commands) -> None:
    """Django reads no body without a Content-Length: sent in chunks to a
    server that decodes them (gunicorn), it is read here, whole within the
    limit, refused (the project's 413) past it, never cut; runserver cannot
    decode chunks, so it answers 411 rather than take the body for empty."""
    from tests.helpers import post_chunked, shortcut_on, wait_for
    from tests.servers import free_port

    port = free_port()
    env = commands.env(TEST_STREAMER_MAX_BODY_BYTES="20000")
    commands.start(
        "tests.django.wsgi:application", "--bind", f"127.0.0.1:{port}", "--threads", "4", module="gunicorn", env=env
    )
    runserver_port = free_port()
    commands.start("runserver", f"127.0.0.1:{runserver_port}", "--noreload", env=env)

    def up(at: int) -> bool:
        try:
            return post_chunked(at, "/double", b'{"x": 1}', "application/json")[0] in (200, 411)
        except OSError:
            return False

    assert wait_for(lambda: up(port) and up(runserver_port), 60, interval=0.2), "the servers did not start"
    if not shortcut_on("django-body"):  # Django's own reading reads no body without a length: said, not taken as empty
        status, _, body = post_chunked(port, "/double", b'{"x": 21}', "application/json")
        assert status == 411 and "django-body shortcut" in body["error"]["message"], (status, body)
        return
    assert post_chunked(port, "/double", b'{"x": 21}', "application/json")[2] == 42
    assert post_chunked(port, "/double", b"x=" + b"7" * 3, "application/x-www-form-urlencoded")[2] == 1554
    form = upload(b"\x00" * 15_000, "f.bin")
    status, _, answer = post_chunked(port, "/upload", form["data"], form["content_type"])
    assert status == 200 and answer["length"] == 15_000, answer
    for data, content_type in (
        (b'{"x": "' + b"a" * 50_000 + b'"}', "application/json"),
        (b"x=" + b"a" * 19_999, "application/x-www-form-urlencoded"),
    ):
        status, headers, body = post_chunked(port, "/double", data, content_type, chunk=4096)
        assert status == 413 and headers["content-type"] == "application/json", (status, body)
        assert body["error"]["type"] == "PayloadTooLarge" and "20000" in body["error"]["message"], body
    status, headers, body = post_chunked(runserver_port, "/double", b'{"x": 1}', "application/json")
    assert status == 411 and body["error"]["type"] == "LengthRequired", (status, body)


def test_the_fast_path_reads_what_djangos_parser_reads() -> None:
    """``streamer_core.web.multipart`` on a body of Django's test client,
    against Django's own parser (a file holding CRLFs and what looks like
    the boundary, a non-ASCII field)."""
    from django.core.files.uploadedfile import SimpleUploadedFile
    from django.core.files.uploadhandler import MemoryFileUploadHandler
    from django.http.multipartparser import MultiPartParser
    from django.test.client import BOUNDARY, encode_multipart

    from streamer_core.web.multipart import Form, parse_form

    payload = b"\xff\xd8\r\n--" + BOUNDARY.encode()[:-1] + b"\r\n"  # nearly the boundary
    body = encode_multipart(BOUNDARY, {"s": "héllo", "file": SimpleUploadedFile("cat.jpg", payload)})
    meta = {"CONTENT_TYPE": f"multipart/form-data; boundary={BOUNDARY}", "CONTENT_LENGTH": str(len(body))}
    fields, files = MultiPartParser(meta, io.BytesIO(body), [MemoryFileUploadHandler()]).parse()
    expected = Form({k: fields[k] for k in fields}, {k: files[k].read() for k in files})
    assert parse_form(body, BOUNDARY) == expected == Form({"s": "héllo"}, {"file": payload})


def test_bodies_the_fast_path_declines_are_read_by_django(client: Client, settings: Any) -> None:
    """A body of another shape (a preamble), one over
    DATA_UPLOAD_MAX_MEMORY_SIZE (which ``request.body`` would refuse but the
    form parser takes: files do not count), and one whose fields Django's
    limits refuse: each answered as Django's parser answers it."""
    kwargs = upload(PAYLOAD[:1000])
    kwargs["data"] = b"a preamble\r\n" + kwargs["data"]
    response = client.post("/upload", **kwargs)
    assert response.status_code == 200 and response.json()["length"] == 1000, response.content
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 10_000
    response = client.post("/upload", **upload(PAYLOAD[:200_000]))
    assert response.status_code == 200 and response.json()["length"] == 200_000, response.content
    settings.DATA_UPLOAD_MAX_NUMBER_FIELDS = 2
    response = client.post("/upload", {"a": "1", "b": "2", "c": "3", "file": "x"})
    assert response.status_code == 400, response.content


def test_djangos_limit_on_files_holds_on_the_fast_path(client: Client, settings: Any) -> None:
    """A small multipart body of the common shape is cut by the fast path,
    and Django's own DATA_UPLOAD_MAX_NUMBER_FILES still holds for it: one
    file more than it allows is refused as Django refuses it (400)."""
    boundary = "streamer-test-boundary"

    def files(count: int) -> Any:
        parts = b"".join(
            f'--{boundary}\r\nContent-Disposition: form-data; name="f{n}"; filename="f{n}.bin"\r\n'.encode()
            + b"Content-Type: application/octet-stream\r\n\r\n"
            + PAYLOAD[:100]
            + b"\r\n"
            for n in range(count - 1)
        )
        last = upload(PAYLOAD[:1000])  # the view's own file, "file", last
        body = parts + last["data"].replace(b"streamer-test-boundary", boundary.encode())
        return {"data": body, "content_type": f"multipart/form-data; boundary={boundary}"}

    settings.DATA_UPLOAD_MAX_NUMBER_FILES = 3
    response = client.post("/upload", **files(3))
    assert response.status_code == 200 and response.json()["length"] == 1000, response.content
    response = client.post("/upload", **files(4))
    assert response.status_code == 400, response.content
    assert "files" in response.json()["error"]["message"].lower(), response.content
