"""The shortcuts through other packages' private workings
(``streamer_core.shortcuts``): each taken only on the releases CI runs,
all of them off with ``STREAMER_SHORTCUTS=0``, and the newest releases
installed inside every range, so that CI's newest run takes them all."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any, Dict

import pytest

from streamer_core import shortcuts
from tests.helpers import ROOT, wait_for
from tests.servers import free_port


@pytest.mark.parametrize(
    ("text", "release"),
    [("3.1.3", (3, 1, 3)), ("3.2.0rc1", (3, 2, 0)), ("26.9", (26, 9)), ("1.45.2.dev0", (1, 45, 2)), ("x", ())],
)
def test_a_release_is_read_from_its_version(text: str, release: Any) -> None:
    assert shortcuts.release_of(text) == release


def test_a_release_outside_its_range_turns_the_shortcut_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("STREAMER_SHORTCUTS", raising=False)
    dispatch = shortcuts.SHORTCUTS["flask-dispatch"]
    version = shortcuts.installed("flask")
    assert version is not None and shortcuts.release_problem("flask-dispatch") is None
    monkeypatch.setitem(shortcuts.SHORTCUTS, "flask-dispatch", dispatch._replace(lowest=(1, 0), below=(1, 1)))
    assert not shortcuts.allowed("flask-dispatch")
    assert shortcuts.problem("flask-dispatch") == f"flask {version} is newer than the 1.0 to 1.0.x it is tested on"
    monkeypatch.setitem(shortcuts.SHORTCUTS, "flask-dispatch", dispatch._replace(lowest=(99,), below=(100,)))
    assert f"flask {version} is older than the 99 to 99.x it is tested on" == shortcuts.problem("flask-dispatch")
    monkeypatch.setitem(shortcuts.SHORTCUTS, "flask-dispatch", dispatch._replace(distribution="no-such-package"))
    assert shortcuts.problem("flask-dispatch") == "no-such-package is not installed"


@pytest.mark.parametrize("value", ["0", "false", "Off", " no "])
def test_the_environment_variable_turns_every_shortcut_off(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv("STREAMER_SHORTCUTS", value)
    for name in shortcuts.SHORTCUTS:
        assert shortcuts.problem(name) == f"STREAMER_SHORTCUTS={value}"
    level, line = shortcuts.summary(shortcuts.SHORTCUTS)
    assert level == logging.INFO and "on: none" in line and f"(STREAMER_SHORTCUTS={value})" in line


def test_an_apps_setting_turns_off_its_own_shortcuts_not_the_processes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STREAMER_SHORTCUTS", "1")  # on: any other value
    assert shortcuts.problem("flask-dispatch", False, "STREAMER_SHORTCUTS") == "STREAMER_SHORTCUTS is False"
    assert shortcuts.problem("otel-spans", False) == shortcuts.release_problem("otel-spans")  # the process's own


def test_the_line_warns_of_a_release_newer_than_the_tested_ones(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("STREAMER_SHORTCUTS", raising=False)
    writing = shortcuts.SHORTCUTS["gevent-writing"]
    monkeypatch.setitem(shortcuts.SHORTCUTS, "gevent-writing", writing._replace(below=(1,)))
    level, line = shortcuts.summary(["gevent-reading", "gevent-writing"])
    assert level == logging.WARNING
    assert line.startswith("shortcuts through other packages' private workings: on: gevent-reading (gevent ")
    assert "; off, their public paths taken: gevent-writing (gevent " in line and "is newer than the" in line


def test_the_newest_releases_installed_are_inside_every_range() -> None:
    """CI's newest run takes every shortcut: a release newer than a range
    fails here (run the suite on it, then raise the range's ``below``)."""
    newer = {name: shortcuts.release_problem(name) for name in shortcuts.SHORTCUTS}
    assert {name: why for name, why in newer.items() if why and "newer than" in why} == {}


def _served_process(tmp_path: Path, env: Dict[str, str]) -> Dict[str, Any]:
    """What ``tests.flask.warm_app``'s ``/process`` says of the handler under
    the example's gunicorn (``gevent_pywsgi``) run with ``env``."""
    port = free_port()
    argv = [
        sys.executable, "-m", "gunicorn", "-c", "example_flask/gunicorn.conf.py", "-w", "1",
        "--bind", f"127.0.0.1:{port}", "tests.flask.warm_app:create_app()",
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(ROOT), "MARK_FOLDER": str(tmp_path), "PIN_WORKERS": "0", **env}
    log = tmp_path / "gunicorn.log"
    with open(log, "wb") as out:
        server = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:

        def answered() -> Any:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/process", timeout=5) as response:
                    return json.loads(response.read())
            except OSError:
                return None

        found = wait_for(answered, 90)
        assert found, log.read_text()
        found["log"] = log.read_text()
        return dict(found)
    finally:
        os.killpg(server.pid, signal.SIGKILL)
        server.wait(10)


@pytest.mark.parametrize(
    "env",
    [{"STREAMER_SHORTCUTS": "0"}, {"FLASK_STREAMER_SHORTCUTS": "false"}],
    ids=["environment", "app-setting"],
)
def test_switched_off_the_server_keeps_gevents_and_gunicorns_own_handler(tmp_path: Path, env: Dict[str, str]) -> None:
    seen = _served_process(tmp_path, env)
    assert seen["handler"] == "gunicorn.workers.ggevent.PyWSGIHandler", seen
    assert seen["sendall"] == "gevent.pywsgi.WSGIHandler._sendall"
    assert seen["log_request"] == "gunicorn.workers.ggevent.PyWSGIHandler.log_request"


@pytest.mark.parametrize(
    ("version", "inside"),
    [
        ("3.0", True),
        ("3.0.0", True),
        ("3.1.9", True),
        ("3.2", False),
        ("3.2.0", False),
        ("3.2.0rc1", False),
        ("2.3.3", False),
    ],
)
def test_a_range_holds_its_lowest_release_and_not_its_bound(
    monkeypatch: pytest.MonkeyPatch, version: str, inside: bool
) -> None:
    """``lowest`` is in the range, ``below`` is not, however many parts a
    version is written with."""
    assert shortcuts.SHORTCUTS["flask-dispatch"][2:4] == ((3, 0), (3, 2))
    monkeypatch.setattr(shortcuts, "installed", lambda distribution: version)
    assert (shortcuts.release_problem("flask-dispatch") is None) is inside


def test_the_floor_of_a_package_named_in_several_extras_is_its_highest(tmp_path: Path) -> None:
    import importlib.util

    spec = importlib.util.spec_from_file_location("ci_floors", ROOT / ".ci" / "floors.py")
    assert spec is not None and spec.loader is not None
    floors = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(floors)
    pyproject = tmp_path / "pyproject.toml"
    pyproject.write_text(
        '[project]\nname = "x"\n[project.optional-dependencies]\n'
        'a = ["redis>=7.1", "flask>=3.0,<4"]\nb = ["redis>=8.0", "gevent==24.2.1"]\n'
        'test = ["pytest>=7.4"]\n'
    )
    assert floors.floors(pyproject) == {"redis": "8.0", "flask": "3.0", "gevent": "24.2.1"}
    pyproject.write_text('[project]\nname = "x"\n[project.optional-dependencies]\na = ["redis"]\n')
    with pytest.raises(SystemExit, match="has no lower bound"):
        floors.floors(pyproject)
