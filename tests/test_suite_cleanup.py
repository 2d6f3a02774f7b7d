"""The suite itself: every process a test or fixture starts is stopped
whatever goes wrong. A run against older dependency releases left 60
private redis-servers behind: a client library's TypeError while a
fixture started or first pinged its server skipped the kill, in every
test that used it. Here the failures are made on purpose, in a pytest run
of their own, and nothing it started may outlive it."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any, List

import pytest

from tests.helpers import ROOT, alive, stop_all, stop_each, wait_for

#: Tests of the Redis fixtures, each failing in another place: the server's
#: first ping, the test's first client once the server runs, the deletion
#: of the test's keys as the test ends.
FAILING = """
import pytest
import redis

from tests.redis.conftest import Broker
from tests.servers import RedisServer


def older_client(*args, **kwargs):
    raise TypeError("an older client library's signature")


def test_the_first_ping_raises(monkeypatch, request):
    monkeypatch.setattr(RedisServer, "ping", older_client)
    request.getfixturevalue("fault_broker")


def test_the_first_client_raises(monkeypatch, request):
    monkeypatch.setattr(redis.Redis, "from_url", older_client)
    request.getfixturevalue("fault_broker")


def test_the_cleanup_raises(monkeypatch, request):
    monkeypatch.setattr(Broker, "cleanup", older_client)
    broker = request.getfixturevalue("fault_broker")
    assert broker.server.ping()
    print("SERVER", broker.server.process.pid)
"""


def redis_servers_under(folder: Path) -> List[int]:
    """The live redis-server processes that work in a folder under ``folder``
    (each runs in its ``--dir``; its command line it rewrites)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if entry.joinpath("comm").read_text().strip() != "redis-server":
                continue
            works_in = Path(os.readlink(entry / "cwd"))
        except OSError:
            continue
        if works_in.is_relative_to(folder) and alive(int(entry.name)):
            found.append(int(entry.name))
    return found


def test_a_fixture_that_fails_starting_its_server_leaves_no_process(tmp_path: Path) -> None:
    if shutil.which("redis-server") is None:
        pytest.skip("needs redis-server on PATH")
    test_file = tmp_path / "test_failing_fixtures.py"
    test_file.write_text(FAILING)
    inner = tmp_path / "inner"
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "tests.redis.conftest", "-p", "no:cacheprovider", "-p", "no:xdist",
         "-s", "-q", "-o", "addopts=", f"--basetemp={inner}", str(test_file)],
        cwd=ROOT, env={"PYTHONPATH": str(ROOT), "PATH": str(Path(sys.executable).parent) + ":/usr/bin:/bin"},
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    said = done.stdout + done.stderr
    assert "TypeError: an older client library's signature" in said, said[-3000:]
    # Each failed where it should: two as their fixture started, one as it ended.
    assert said.splitlines()[-1].startswith("2 failed, 1 passed, 1 error in"), said[-3000:]
    assert "SERVER " in done.stdout, "the third started its server, and failed only as it ended"
    assert wait_for(lambda: not redis_servers_under(inner), 5), f"left running: {redis_servers_under(inner)}"


def test_a_redis_server_whose_first_ping_raises_is_not_left_running(tmp_path: Path, monkeypatch: Any) -> None:
    """The server's own start, as the session's Redis fixture uses it."""
    if shutil.which("redis-server") is None:
        pytest.skip("needs redis-server on PATH")
    from tests.servers import RedisServer

    def older_client(self: RedisServer) -> bool:
        raise TypeError("an older client library's signature")

    monkeypatch.setattr(RedisServer, "ping", older_client)
    server = RedisServer(tmp_path)
    try:
        with pytest.raises(TypeError):
            server.start()
        assert server.process is not None
        assert not alive(server.process.pid), "the server outlived its failed start"
    finally:
        server.kill()


def test_stopping_goes_on_past_a_stop_that_raises(tmp_path: Path) -> None:
    """What a teardown stops is stopped, each, whatever one of them raised;
    the first error is raised after."""
    stopped: List[str] = []

    def broken() -> None:
        stopped.append("broken")
        raise TypeError("broken")

    sleepers = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"]) for _ in range(2)]
    with pytest.raises(TypeError, match="broken"):
        stop_all([broken, lambda: stop_each(sleepers), lambda: stopped.append("after")])
    assert stopped == ["broken", "after"]
    assert [sleeper.returncode for sleeper in sleepers] == [-9, -9]
