"""A client that disconnects while its request waits for a busy model:
under uvicorn, ASGI's ``http.disconnect`` makes Django cancel the async
view, and under gunicorn's gthread worker the sync view notices the closed
socket; either way the call is given up, its input never reaches the model,
and it is counted as dropped for ``disconnected``."""

from __future__ import annotations

import json
import time
import urllib.request
from pathlib import Path
from typing import Any, Dict, List, Tuple

import pytest

from tests.core.models import ran_inputs
from tests.flask.live import in_background
from tests.helpers import post_and_leave, wait_for
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


def _servers(port: int) -> Dict[str, List[str]]:
    return {
        "uvicorn": ["-m", "uvicorn", "tests.django.asgi:application", "--host", "127.0.0.1", "--port", str(port),
                    "--log-level", "warning"],
        "gunicorn-gthread": ["-m", "gunicorn", "tests.django.wsgi:application", "-b", f"127.0.0.1:{port}",
                             "-w", "1", "-k", "gthread", "--threads", "8", "--log-level", "warning"],
    }  # fmt: skip


@pytest.mark.parametrize("server, path", [("uvicorn", "/agate"), ("gunicorn-gthread", "/gate")])
def test_a_client_that_leaves_never_reaches_the_model(commands: Any, tmp_path: Path, server: str, path: str) -> None:
    port = free_port()
    (tmp_path / "hold").write_text("")
    argv = _servers(port)[server]
    process = commands.start(*argv[2:], module=argv[1], env=commands.env(TEST_STREAMER_FOLDER=str(tmp_path)))

    def up() -> bool:
        try:
            return _call(port, "/gate-dropped", timeout=2)[0] == 200
        except OSError:
            return False

    assert wait_for(up, 30, interval=0.1), commands.log(process)
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
