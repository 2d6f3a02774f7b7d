"""A server refuses to boot on a ``STREAMER`` setting so wrong that no
request could be served, and says why: system checks run only under
``manage.py``, so gunicorn, uvicorn and uWSGI load the app without them.
Each server runs for real on 127.0.0.1, with the example project (uWSGI
with the README's flags: without ``--need-app`` it serves a 500 instead)."""

from __future__ import annotations

import http.client
import json
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import List, Tuple

import pytest

from tests.helpers import wait_for
from tests.servers import free_port

SERVERS = {
    "gunicorn": ("gunicorn", ["example_django.wsgi:application", "--workers", "1", "--threads", "4"]),
    "uvicorn": ("uvicorn", ["example_django.asgi:application", "--log-level", "warning"]),
    "uwsgi": (
        "uwsgi",
        [
            "--module",
            "example_django.wsgi:application",
            "--master",
            "--processes",
            "1",
            "--threads",
            "4",
            "--lazy-apps",
            "--need-app",
            "--die-on-term",
        ],
    ),  # fmt: skip
}


def _start(commands, server: str, port: int, backend: str) -> subprocess.Popen:
    module, args = SERVERS[server]
    env = commands.env(DJANGO_SETTINGS_MODULE="example_django.settings", STREAMER_BACKEND=backend)
    if server == "uwsgi":
        program = str(Path(sys.executable).with_name("uwsgi"))
        return commands.start(*args, "--http", f"127.0.0.1:{port}", program=program, env=env)
    bind = ["--bind", f"127.0.0.1:{port}"] if server == "gunicorn" else ["--host", "127.0.0.1", "--port", str(port)]
    return commands.start(*args, *bind, module=module, env=env)


def _get(url: str) -> Tuple[int, str, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status, response.headers.get("Content-Type", ""), response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers.get("Content-Type", ""), exc.read().decode()


@pytest.mark.parametrize("server", list(SERVERS))
def test_a_wrong_setting_stops_the_server_from_booting_with_its_message(commands, server):
    process = _start(commands, server, free_port(), backend="proces")
    try:
        process.wait(60)
    except subprocess.TimeoutExpired:
        pytest.fail(f"{server} booted with STREAMER['BACKEND'] = 'proces':\n{commands.log(process)[-2000:]}")
    log = commands.log(process)
    assert process.returncode != 0
    assert "ImproperlyConfigured" in log, log[-2000:]
    assert "STREAMER_BACKEND in the environment (STREAMER['BACKEND']) is 'proces'" in log, "named as it was set"
    assert "django_streamer.E002" in log and "Set BACKEND to" in log, "the fix is named too"


@pytest.mark.parametrize("server", list(SERVERS))
def test_with_right_settings_the_server_boots_and_answers_json(commands, server):
    port = free_port()
    process = _start(commands, server, port, backend="thread")
    base = f"http://127.0.0.1:{port}"
    seen: List[Tuple[int, str, str]] = []

    def up() -> bool:
        try:
            seen.append(_get(f"{base}/stream"))
        except OSError:
            return False
        return True

    assert wait_for(up, 60, interval=0.2), commands.log(process)[-2000:]
    status, content_type, body = seen[-1]
    assert status == 405 and content_type == "application/json", body
    assert json.loads(body)["error"]["status"] == 405
    time.sleep(0.1)
    assert process.poll() is None


def test_under_uwsgi_the_models_load_before_the_first_request(commands):
    """uWSGI has no hook like gunicorn's ``post_worker_init``: the example's
    WSGI module loads the models as each lazy-apps worker imports it, so the
    first caller does not wait for a model (and readiness says ready)."""
    port = free_port()
    process = _start(commands, "uwsgi", port, backend="thread")
    # Both of the example's models (embed, classify) say they are ready.
    both = wait_for(lambda: commands.log(process).count("ready on") >= 2, 90, interval=0.2)
    log = commands.log(process)
    assert both, log[-2000:]
    assert "loading as the server starts" in log and "loading on its first use" not in log, log[-2000:]
    status, _, body = _get(f"http://127.0.0.1:{port}/readyz")
    assert status == 200, body
    # uWSGI does not decode a chunked body for the app: the README says 411.
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    headers = {"Content-Type": "application/json", "Transfer-Encoding": "chunked"}
    # The body in chunks, sent with the headers in one write: sent after them,
    # it could meet the connection uWSGI closed with its 411 (a broken pipe).
    chunked = b'10\r\n{"s": "chunked"}\r\n0\r\n\r\n'
    connection.request("POST", "/stream", body=chunked, headers=headers)
    answer = connection.getresponse()
    assert answer.status == 411 and "Content-Length" in json.loads(answer.read())["error"]["message"]
    connection.close()
