"""A client that disconnects while its request waits for a busy model:
under uvicorn, ASGI's ``http.disconnect`` makes Django cancel the async
view, and under gunicorn's gthread worker the sync view notices the closed
socket; either way the call is given up, its input never reaches the model,
and it is counted as dropped for ``disconnected``. One that disconnects
before its whole body arrived is counted as ``cancelled`` too, not as an
invalid input; a malformed body sent in chunks is the client's 400, not a
server error."""

from __future__ import annotations

import json
import time
import urllib.request
from pathlib import Path
from typing import Any, Dict, List, Tuple

import pytest

from tests.core.models import ran_inputs
from tests.flask.live import in_background
from tests.helpers import CUT_BODIES, post_and_leave, post_raw, shortcut_on, wait_for
from tests.servers import free_port


def _call(port: int, path: str, body: Any = None, timeout: float = 30.0) -> Tuple[int, Any]:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=data, method="POST" if data else "GET")
    request.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read() or b"null")


def _up(port: int) -> bool:
    """Whether the server on ``port`` answers yet."""
    try:
        return _call(port, "/gate-outcomes", timeout=2)[0] == 200
    except OSError:
        return False


def _servers(port: int) -> Dict[str, List[str]]:
    return {
        "uvicorn": ["-m", "uvicorn", "tests.django.asgi:application", "--host", "127.0.0.1", "--port", str(port),
                    "--log-level", "warning"],
        "gunicorn-gthread": ["-m", "gunicorn", "tests.django.wsgi:application", "-b", f"127.0.0.1:{port}",
                             "-w", "1", "-k", "gthread", "--threads", "8", "--log-level", "warning"],
        "gunicorn-gevent_pywsgi": ["-m", "gunicorn", "tests.django.wsgi:application", "-b", f"127.0.0.1:{port}",
                                   "-w", "1", "-k", "gevent_pywsgi", "--log-level", "warning"],
    }  # fmt: skip


@pytest.mark.parametrize(
    "server, path", [("uvicorn", "/agate"), ("gunicorn-gthread", "/gate"), ("gunicorn-gevent_pywsgi", "/gate")]
)
def test_a_client_that_leaves_never_reaches_the_model(commands: Any, tmp_path: Path, server: str, path: str) -> None:
    port = free_port()
    (tmp_path / "hold").write_text("")
    argv = _servers(port)[server]
    process = commands.start(*argv[2:], module=argv[1], env=commands.env(TEST_STREAMER_FOLDER=str(tmp_path)))

    assert wait_for(lambda: _up(port), 30, interval=0.1), commands.log(process)
    held, box = in_background(_call, port, path, "hold")
    assert wait_for(lambda: (tmp_path / "inside").exists(), 10), "the held request never reached the model"
    post_and_leave(port, path, "left", stay_s=0.3)
    time.sleep(0.5)  # uvicorn tells at once; a sync view looks at the socket every 0.1 s
    (tmp_path / "hold").unlink()
    held.join(15)
    assert box.get("result") == (200, "ok:hold"), (box, commands.log(process))
    assert _call(port, path, "after") == (200, "ok:after")
    assert ran_inputs(tmp_path) == ["hold", "after"], "the model ran the request of a client that had left"
    assert _call(port, "/gate-dropped")[1] == {"cancelled": 0, "expired": 0, "disconnected": 1}


def _cut_servers(port: int) -> Dict[str, List[str]]:
    import sys

    uwsgi = str(Path(sys.executable).with_name("uwsgi"))
    return {
        "gunicorn-gthread": [sys.executable, *_servers(port)["gunicorn-gthread"]],
        "gunicorn-gevent_pywsgi": [sys.executable, *_servers(port)["gunicorn-gevent_pywsgi"]],
        "uwsgi": [uwsgi, "--http-socket", f"127.0.0.1:{port}", "--module", "tests.django.wsgi:application",
                  "--master", "--processes", "1", "--threads", "4", "--disable-logging", "--die-on-term"],
        "granian": [sys.executable, "-m", "granian", "--interface", "wsgi", "--host", "127.0.0.1", "--port",
                    str(port), "--blocking-threads", "4", "--no-ws", "--log-level", "warning",
                    "tests.django.wsgi:application"],
    }  # fmt: skip


@pytest.mark.parametrize("server", ["gunicorn-gthread", "gunicorn-gevent_pywsgi", "uwsgi", "granian"])
def test_a_client_that_leaves_mid_body_is_cancelled_not_an_invalid_input(
    commands: Any, tmp_path: Path, server: str
) -> None:
    """gunicorn: the client's socket is seen closed; uWSGI raises reading
    (Django's ``UnreadablePostError``: a cancelled upload); granian hands
    the view what came (its length tells). Only gunicorn decodes a body in
    chunks that a client cut short."""
    port = free_port()
    argv = _cut_servers(port)[server]
    process = commands.start(*argv[1:], env=commands.env(TEST_STREAMER_FOLDER=str(tmp_path)), program=argv[0])

    def outcomes() -> Dict[str, int]:
        found: Dict[str, int] = _call(port, "/gate-outcomes", timeout=2)[1]
        return found

    assert wait_for(lambda: _up(port), 30, interval=0.1), commands.log(process)
    gunicorn = server.startswith("gunicorn")
    chunks = gunicorn and shortcut_on("django-body")  # Django's own reading refuses chunks: 411
    cuts = list(CUT_BODIES.values()) if chunks else [CUT_BODIES["content-length"]]
    for n, (head, body) in enumerate(cuts, 1):
        post_raw(port, "/gate", head, body, leave=True)
        assert wait_for(lambda n=n: outcomes()["cancelled"] == n, 5), (outcomes(), commands.log(process))
    if chunks:
        # A malformed chunk size, the client waiting for its answer: a 400 that says why.
        answer = post_raw(port, "/gate", "Transfer-Encoding: chunked\r\n", b'zz\r\n{"s": "x"}\r\n0\r\n\r\n')
        assert answer.startswith(b"HTTP/1.1 400"), answer[:300]
        assert b"the body sent in chunks could not be read" in answer, answer
    found = outcomes()
    assert (found["cancelled"], found["invalid"], found["model_error"]) == (len(cuts), int(chunks), 0), found
    assert ran_inputs(tmp_path) == []
    assert "Traceback" not in commands.log(process)
