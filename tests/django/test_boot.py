"""A server refuses to boot on a ``STREAMER`` setting so wrong that no
request could be served, and says why: system checks run only under
``manage.py``, so gunicorn and uvicorn load the app without them. Each
server runs for real on 127.0.0.1, with the example project."""

from __future__ import annotations

import json
import subprocess
import time
import urllib.error
import urllib.request
from typing import List, Tuple

import pytest

from tests.helpers import wait_for
from tests.servers import free_port

SERVERS = {
    "gunicorn": ("gunicorn", ["example_django.wsgi:application", "--workers", "1", "--threads", "4"]),
    "uvicorn": ("uvicorn", ["example_django.asgi:application", "--log-level", "warning"]),
}


def _start(commands, server: str, port: int, backend: str) -> subprocess.Popen:
    module, args = SERVERS[server]
    bind = ["--bind", f"127.0.0.1:{port}"] if server == "gunicorn" else ["--host", "127.0.0.1", "--port", str(port)]
    env = commands.env(DJANGO_SETTINGS_MODULE="example_django.settings", STREAMER_BACKEND=backend)
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
    assert "ImproperlyConfigured" in log and "STREAMER['BACKEND'] is 'proces'" in log, log[-2000:]
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
