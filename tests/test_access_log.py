"""gunicorn's access log under gevent's own HTTP server (``gevent_pywsgi``,
the examples' worker class): where none is written, the web process's
request handler skips building what it would log
(:func:`streamer_core.web.gunicorn.skip_unlogged_access`); where one is
written, or the logger is another class, it is left as gunicorn made it.
Real gunicorn objects in process, and a real gunicorn writing its log."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any, Iterator, List

import pytest

from streamer_core.web.gunicorn import skip_unlogged_access
from tests.helpers import needs_shortcut, shortcut_on, wait_for
from tests.servers import free_port

pytest.importorskip("gevent")
from gunicorn.config import Config  # noqa: E402
from gunicorn.glogging import Logger  # noqa: E402
from gunicorn.instrument.statsd import Statsd  # noqa: E402
from gunicorn.workers.ggevent import GeventPyWSGIWorker, PyWSGIHandler  # noqa: E402
from gunicorn.workers.gthread import ThreadWorker  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


MADE: List[Any] = []


def worker(kind: Any = GeventPyWSGIWorker, logger: Any = Logger, **settings: Any) -> Any:
    """A gunicorn worker as its master makes one, before it forks."""
    cfg = Config()
    for name, value in settings.items():
        cfg.set(name, value)
    made = kind(0, os.getpid(), [], None, 30, cfg, logger(cfg))
    MADE.append(made)
    return made


@pytest.fixture(autouse=True)
def close_workers() -> Iterator[None]:
    yield
    while MADE:
        made = MADE.pop()
        made.tmp.close()  # the heartbeat file each worker opens
        sock = getattr(made.log, "sock", None)  # statsd's UDP socket
        if sock is not None:
            sock.close()


@needs_shortcut("gunicorn-access-log", switch=False)
def test_without_an_access_log_the_handler_logs_nothing() -> None:
    unlogged = worker()
    skip_unlogged_access(unlogged)
    assert unlogged.wsgi_handler is not PyWSGIHandler
    assert issubclass(unlogged.wsgi_handler, PyWSGIHandler), "everything else is gunicorn's handler's"
    assert unlogged.wsgi_handler.log_request(object()) is None  # touches nothing of the request


def test_a_logger_that_cannot_say_whether_it_logs_access_keeps_gunicorns_handler(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """gunicorn releases whose logger has no ``access_log_enabled``: the
    handler's work may be what logs, so it stays."""
    monkeypatch.delattr(Logger, "access_log_enabled", raising=False)
    older = worker()
    skip_unlogged_access(older)
    assert older.wsgi_handler is PyWSGIHandler


@pytest.mark.parametrize(
    "made",
    [
        lambda: worker(accesslog="-"),  # --access-logfile -
        lambda: worker(logconfig_dict={"version": 1, "loggers": {}}),  # a logging config may log access
        lambda: worker(logger=Statsd, statsd_host="127.0.0.1:9125"),  # counts requests in access()
        lambda: worker(ThreadWorker),  # gthread: no gevent handler to change
    ],
    ids=["access-logfile", "logconfig", "statsd", "gthread"],
)
def test_where_requests_are_logged_or_counted_the_handler_is_gunicorns(made: Any) -> None:
    kept = made()
    before = getattr(kept, "wsgi_handler", None)
    skip_unlogged_access(kept)
    assert getattr(kept, "wsgi_handler", None) is before


@pytest.mark.parametrize("logged", [False, True], ids=["no-access-log", "access-logfile"])
def test_the_examples_gunicorn_skips_the_access_log_unless_asked_for_one(tmp_path: Path, logged: bool) -> None:
    """The example's conf (``gevent_pywsgi``, the hooks that settle the
    process): without an access log the process serves with a handler
    that logs nothing; with ``--access-logfile``, with gunicorn's
    ``log_request``, and each request gets its line."""
    port = free_port()
    access = tmp_path / "access.log"
    argv = [
        sys.executable, "-m", "gunicorn", "-c", "example_flask/gunicorn.conf.py", "-w", "1",
        "--bind", f"127.0.0.1:{port}", *(["--access-logfile", str(access)] if logged else []),
        "tests.flask.warm_app:create_app()",
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(ROOT), "MARK_FOLDER": str(tmp_path), "PIN_WORKERS": "0"}
    with open(tmp_path / "gunicorn.log", "wb") as out:
        server = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:

        def answered() -> Any:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/process", timeout=5) as response:
                    return json.loads(response.read())
            except OSError:
                return None

        first = wait_for(answered, 90)
        assert first, (tmp_path / "gunicorn.log").read_text()
        second = answered()
        # With or without an access log; gevent's own where that shortcut is off.
        writing = "streamer_core.web.writing" if shortcut_on("gevent-writing") else "gevent.pywsgi.WSGIHandler"
        assert first["sendall"] == f"{writing}._sendall"
        if not logged:
            taken = any(shortcut_on(name) for name in ("gevent-reading", "gevent-writing", "gunicorn-access-log"))
            handler = "streamer_core.web.gunicorn" if taken else "gunicorn.workers.ggevent"
            assert first["handler"] == second["handler"] == f"{handler}.PyWSGIHandler"
            if shortcut_on("gunicorn-access-log"):
                assert first["log_request"] == "streamer_core.web.gunicorn._log_nothing"
            else:  # off: gunicorn's own, which finds that nothing is logged
                assert first["log_request"] == "gunicorn.workers.ggevent.PyWSGIHandler.log_request"
            assert not access.exists()
            return
        assert first["log_request"] == second["log_request"] == "gunicorn.workers.ggevent.PyWSGIHandler.log_request"
        lines = lambda: [line for line in access.read_text().splitlines() if '"GET /process' in line]  # noqa: E731
        assert wait_for(lambda: len(lines()) >= 2, 10), access.read_text()
        assert " 200 " in lines()[-1]
    finally:
        os.killpg(server.pid, signal.SIGKILL)
        server.wait(10)
