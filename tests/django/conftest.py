"""The Django tests' set-up: the test project's settings (this directory
only: the rest of the suite does not use Django), streamers closed after
every test, and helpers to run ``manage.py``-style commands as subprocesses.

pytest-django is told nothing in pyproject.toml; the settings module is
chosen here, when this directory is collected, and Django set up at once.
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional

import pytest

from tests.helpers import stop_each

try:
    import django
except ImportError:  # pragma: no cover - django is in the test extra
    if os.environ.get("CI", "").lower() == "true":
        raise
    collect_ignore_glob = ["test_*.py"]
else:
    os.environ["DJANGO_SETTINGS_MODULE"] = "tests.django.settings"
    django.setup()

ROOT = Path(__file__).resolve().parents[2]
SETTINGS_MODULE = "tests.django.settings"


@pytest.fixture(autouse=True)
def _close_streamers() -> Iterator[None]:
    """Every streamer a test started is closed when it ends."""
    from django_streamer import close_streamers

    yield
    close_streamers(timeout=5)


@pytest.fixture
def streamer_settings(settings: Any) -> Any:
    """``update(**top_level_keys)``: change ``settings.STREAMER`` for this
    test (pytest-django puts it back); models keep the project's."""
    from django.conf import settings as live

    def update(models: Optional[Dict[str, Any]] = None, **top: Any) -> Dict[str, Any]:
        value = dict(live.STREAMER, **top)
        if models is not None:
            value["MODELS"] = models
        settings.STREAMER = value
        return value

    return update


@pytest.fixture
def redis_prefix() -> str:
    return f"django-test-{uuid.uuid4().hex[:10]}"


class Commands:
    """``python -m django <command>`` subprocesses of one test, killed (their
    whole process group) at its end whatever happens; their output goes to
    files, read with :meth:`log`."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.started: List[subprocess.Popen] = []
        self.logs: Dict[int, Path] = {}

    def env(self, **extra: str) -> Dict[str, str]:
        env = dict(os.environ, DJANGO_SETTINGS_MODULE=SETTINGS_MODULE, PYTHONPATH=str(ROOT), PYTHONUNBUFFERED="1")
        env.update(extra)
        return env

    def start(
        self,
        *args: str,
        env: Optional[Dict[str, str]] = None,
        module: str = "django",
        script: Optional[str] = None,
        program: Optional[str] = None,
    ) -> subprocess.Popen:
        """``python -m module *args`` (or ``python script *args``, or
        ``program *args``) in the background."""
        log = self.folder / f"command-{len(self.started)}.log"
        if program is not None:
            argv = [program]
        else:
            argv = [sys.executable, script] if script else [sys.executable, "-m", module]
        with open(log, "wb") as out:
            process = subprocess.Popen(
                [*argv, *args],
                cwd=ROOT,
                env=env or self.env(),
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.started.append(process)
        self.logs[process.pid] = log
        return process

    def run(self, *args: str, env: Optional[Dict[str, str]] = None, timeout: float = 60) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "django", *args],
            cwd=ROOT,
            env=env or self.env(),
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    def log(self, process: subprocess.Popen) -> str:
        return self.logs[process.pid].read_text(errors="replace")

    def kill_all(self) -> None:
        stop_each(self.started)  # each group, what a command left of it too


@pytest.fixture
def commands(tmp_path: Path) -> Iterator[Commands]:
    c = Commands(tmp_path)
    yield c
    c.kill_all()
