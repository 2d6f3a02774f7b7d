"""The Flask example under granian (a Rust HTTP server, WSGI on blocking
threads), as the README's Deploy section runs it: its WSGI module loads the
model and freezes what loading made before it serves, the routes answer,
and SIGTERM lets the requests in hand finish."""

from __future__ import annotations

import http.client
import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any, List

import pytest

if importlib.util.find_spec("granian") is None or importlib.util.find_spec("sentence_transformers") is None:
    pytest.skip("needs granian and the example's model (the 'test' extra)", allow_module_level=True)

from streamer_core.web.settling import GC_THRESHOLD  # noqa: E402
from tests.helpers import wait_for  # noqa: E402
from tests.servers import free_port, kill_group  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


def env() -> dict:
    unset = ("FLASK_", "STREAMER_")
    clean = {key: value for key, value in os.environ.items() if not key.startswith(unset)}
    return dict(clean, PYTHONPATH=str(ROOT), PYTHONUNBUFFERED="1")


def last_line_of(script: str) -> str:
    """What ``script`` printed last, run in a fresh interpreter (the WSGI
    module loads the model as it is imported, and sets process-wide state)."""
    out = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, env=env(), capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout.strip().splitlines()[-1]


def test_the_wsgi_module_loads_the_model_then_freezes_what_loading_made():
    """What gunicorn's post_worker_init does, done by the module itself for
    servers without the hook: the model is loaded when the import returns,
    and the objects loading made are frozen (a full collection otherwise
    stalled every waiting request for 200 ms or more)."""
    script = (
        "import gc, json, example_flask.wsgi as w\n"
        "from flask_streamer.state import state_of\n"
        "print(json.dumps([gc.get_freeze_count(), list(gc.get_threshold()), "
        "sorted(r.name for r, h in state_of(w.app).handles.items() if h.started)]))\n"
    )
    frozen, threshold, started = json.loads(last_line_of(script))
    assert frozen > 100_000, "loading made hundreds of thousands of objects: they are frozen"
    assert threshold == list(GC_THRESHOLD)
    assert "stream" in started


def post(port: int, sentence: str) -> Any:
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/stream", json.dumps({"s": sentence}).encode(), {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=60) as response:
        return response.status, json.loads(response.read())


def test_the_wsgi_module_wakes_the_main_thread_on_signals():
    """The relay that wakes a granian worker's main thread when its SIGTERM
    lands on another thread is in place once the module is imported."""
    script = (
        "import signal, threading, example_flask.wsgi\n"
        "fd = signal.set_wakeup_fd(-1)\n"
        "print(fd != -1, any(t.name == 'streamer-signal-relay' for t in threading.enumerate()))\n"
    )
    assert last_line_of(script).split() == ["True", "True"]


def test_under_granian_the_example_answers_and_finishes_requests_in_hand_on_sigterm(tmp_path):
    port = free_port()
    argv = [sys.executable, "-m", "granian", "--interface", "wsgi", "--host", "127.0.0.1", "--port", str(port),
            "--workers", "1", "--blocking-threads", "64", "--no-ws", "example_flask.wsgi:app"]  # fmt: skip
    log = tmp_path / "granian.log"
    with open(log, "wb") as out:
        server = subprocess.Popen(
            argv, cwd=ROOT, env=env(), stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    try:

        def ready() -> bool:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=5) as response:
                    return bool(response.status == 200)
            except OSError:
                return False

        assert wait_for(ready, 180, interval=0.2), log.read_text()[-3000:]
        status, vector = post(port, "Happy birthday to you.")
        assert status == 200 and len(vector) == 384
        # Forty requests sent whole on connections granian has taken, then
        # SIGTERM: each is in hand, and each must be answered.
        connections: List[http.client.HTTPConnection] = []
        for n in range(40):
            connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
            body = json.dumps({"s": "a sentence to embed " * (n % 7 + 1)})
            connection.request("POST", "/stream", body, {"Content-Type": "application/json"})
            connections.append(connection)
        time.sleep(0.3)  # every connection accepted
        server.send_signal(signal.SIGTERM)
        answers: List[Any] = []
        for connection in connections:
            try:
                response = connection.getresponse()
                answers.append((response.status, json.loads(response.read())))
            except Exception as exc:  # noqa: BLE001 - any failure is the test's finding
                answers.append(repr(exc))
            connection.close()
        assert server.wait(60) == 0, log.read_text()[-3000:]
        failed = [a for a in answers if not (isinstance(a, tuple) and a[0] == 200 and len(a[1]) == 384)]
        assert len(answers) == 40 and not failed, failed[:3]
    finally:
        kill_group(server)
