"""A Redis URL that Redis refuses as it is set up (a database number the
server does not have, a wrong password or user) is a setting to fix: every
command and the example's start say it in one line, with what to check, and
exit (2; ``manage.py``, 1, as for any wrong setting), where they printed
redis-py's traceback; ``status --json`` still prints its JSON. The
password is never shown."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Dict, Iterator, List, Tuple

import pytest

from tests.redis.conftest import CLI, ROOT
from tests.servers import RedisServer, free_port, unavailable

PASSWORD = "s3cret-pw"
FLASK = [str(Path(sys.executable).with_name("flask"))]
FLASK_APP = [*FLASK, "--app", "example_flask", "streamer"]
MANAGE = [sys.executable, "example_django/manage.py"]

#: Each command, with the exit status it gives for a wrong setting and
#: whether it prints JSON.
COMMANDS: Dict[str, Tuple[List[str], int, bool]] = {
    "flask status": ([*FLASK_APP, "status"], 2, False),
    "flask status --json": ([*FLASK_APP, "status", "--json"], 2, True),
    "flask run-workers": ([*FLASK_APP, "run-workers"], 2, False),
    "python -m example_flask": ([sys.executable, "-m", "example_flask"], 2, False),
    "streamer-worker": ([*CLI, "tests.redis.models:double"], 2, False),
    "manage.py streamer_status": ([*MANAGE, "streamer_status"], 1, False),
    "manage.py streamer_status --json": ([*MANAGE, "streamer_status", "--json"], 1, True),
    "manage.py run_gpu_workers": ([*MANAGE, "run_gpu_workers"], 1, False),
}

#: The URL's userinfo and database for each refusal, and what the line says to check.
REFUSALS = {
    "database number": (f":{PASSWORD}@", 99, "check the database number and the user"),
    "password": (":wrong-pw@", 0, "check the password (and user)"),
    "user": (f"bob:{PASSWORD}@", 0, "check the password (and user)"),
    "no password": ("", 0, "check the password (and user)"),
}


@pytest.fixture(scope="module")
def guarded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    """A private redis-server that asks for a password (its 16 databases)."""
    if shutil.which("redis-server") is None:
        unavailable("this test needs redis-server on PATH")
    server = RedisServer(tmp_path_factory.mktemp("guarded"), extra_args=["--requirepass", PASSWORD])
    try:
        server.start()
        yield server
    finally:
        server.kill()


@pytest.mark.parametrize("refusal", list(REFUSALS))
@pytest.mark.parametrize("command", list(COMMANDS))
def test_a_url_redis_refuses_is_said_in_one_line(guarded: RedisServer, command: str, refusal: str) -> None:
    args, code, as_json = COMMANDS[command]
    userinfo, database, fix = REFUSALS[refusal]
    url = f"redis://{userinfo}127.0.0.1:{guarded.port}/{database}"
    # The example's own settings: not the test project's, which the Django
    # tests' conftest names in this process's environment when it is loaded.
    env = {
        **os.environ, "PYTHONPATH": str(ROOT), "PORT": str(free_port()), "STREAMER_BACKEND": "redis",
        "STREAMER_REDIS_URL": url, "FLASK_STREAMER_BACKEND": "redis", "FLASK_STREAMER_REDIS_URL": url,
        "DJANGO_SETTINGS_MODULE": "example_django.settings",
    }  # fmt: skip
    try:
        done = subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    except subprocess.TimeoutExpired as exc:
        raise AssertionError(f"{command} did not exit: {exc.stdout!r} {exc.stderr!r}") from None
    said = done.stdout + done.stderr
    assert done.returncode == code, said
    assert "Traceback" not in said and PASSWORD not in said, said
    [line] = [line for line in done.stderr.splitlines() if "Redis refused" in line]
    message = line[line.index("Redis refused") :]
    assert message.startswith(f"Redis refused this client at redis://{'***@' if userinfo else ''}127.0.0.1:"), line
    assert message.endswith(f"{fix} in the Redis URL"), line
    if as_json:
        assert json.loads(done.stdout) == {"ok": False, "models": {}, "errors": [message]}


def test_at_a_request_a_url_redis_refuses_is_a_503_naming_it(guarded: RedisServer) -> None:
    """A streamer started by its first request, not at boot, answers that
    request 503 (``WorkerStartError``, as any model that cannot start), its
    message naming what to check; the next request tries again."""
    from tests.flask.apps import create_redis_app
    from tests.flask.conftest import close_streamers

    app = create_redis_app({"STREAMER_REDIS_URL": f"redis://:{PASSWORD}@127.0.0.1:{guarded.port}/99"})
    try:
        for _ in range(2):
            response = app.test_client().post("/double", json=3)
            assert response.status_code == 503, response.get_data(as_text=True)
            error = response.get_json()["error"]
            assert error["type"] == "WorkerStartError" and "check the database number" in error["message"], error
            assert PASSWORD not in error["message"]
    finally:
        close_streamers(app)
