"""Real servers for the tests: a private redis-server, free ports, and the
spawned worker processes of a parent."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import Any, List, Optional, Sequence

import pytest
import redis

from tests.helpers import alive


def unavailable(reason: str) -> None:
    """No Redis for these tests: a skip on a developer's machine, a failure in CI."""
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"CI=true but {reason}")
    pytest.skip(reason)


def child_processes(parent: int, spawned_only: bool = False) -> List[int]:
    """The child processes of ``parent``, from /proc (gunicorn's workers,
    say); ``spawned_only``: the live ones multiprocessing spawned (a
    streamer's workers, not its resource tracker)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[-1].split()[1])
            cmdline = (entry / "cmdline").read_bytes() if spawned_only else b""
        except (OSError, ValueError, IndexError):
            continue
        if ppid == parent and (not spawned_only or (b"spawn_main" in cmdline and alive(int(entry.name)))):
            found.append(int(entry.name))
    return sorted(found)


def worker_children(parent: int) -> List[int]:
    """Live spawned worker processes of ``parent`` (not its resource tracker)."""
    return child_processes(parent, spawned_only=True)


def kill_group(process: subprocess.Popen[Any]) -> None:
    """SIGKILL the whole process group of ``process`` (started in a session
    of its own: a server and everything it started) and reap it."""
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    process.wait(10)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def free_ports(count: int) -> List[int]:
    """``count`` free ports, all different (held open together while chosen):
    for a test that starts several servers at once."""
    with contextlib.ExitStack() as stack:
        sockets = [stack.enter_context(socket.socket()) for _ in range(count)]
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]


class RedisServer:
    """A redis-server of our own on 127.0.0.1, no persistence; it can be
    killed and started again on the same port (which empties it)."""

    def __init__(self, folder: Path, port: Optional[int] = None, extra_args: Sequence[str] = ()) -> None:
        self.folder = folder
        self.port = port or free_port()
        self.extra_args = list(extra_args)
        self.password: Optional[str] = None
        if "--requirepass" in self.extra_args:
            self.password = self.extra_args[self.extra_args.index("--requirepass") + 1]
        self.process: Optional[subprocess.Popen] = None
        self.starts = 0

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, timeout: float = 10.0) -> None:
        exe = shutil.which("redis-server")
        if exe is None:
            raise RuntimeError("redis-server is not on PATH")
        self.starts += 1
        log = open(self.folder / f"redis-{self.port}-{self.starts}.log", "wb")
        with log:
            self.process = subprocess.Popen(
                [
                    exe,
                    "--port",
                    str(self.port),
                    "--bind",
                    "127.0.0.1",
                    "--save",
                    "",
                    "--appendonly",
                    "no",
                    "--dir",
                    str(self.folder),
                    *self.extra_args,
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        try:
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline:
                if self.process.poll() is not None:
                    raise RuntimeError(f"redis-server exited with {self.process.returncode}: {self.log_text()}")
                if self.ping():
                    return
                time.sleep(0.02)
            raise RuntimeError(f"redis-server did not answer within {timeout}s")
        except BaseException:
            # Whatever stopped the start (a client library's TypeError in
            # the first ping, an interrupt), the server does not outlive it.
            self.kill()
            raise

    def ping(self) -> bool:
        """Whether *our* server answers on the port (not another one that took it)."""
        client = redis.Redis(
            host="127.0.0.1", port=self.port, password=self.password, socket_connect_timeout=0.5, socket_timeout=0.5
        )
        try:
            return self.process is not None and client.info("server")["process_id"] == self.process.pid
        except redis.RedisError:
            return False
        finally:
            client.close()

    def kill(self) -> None:
        """SIGKILL: the server is gone at once, with everything it held."""
        if self.process is not None and self.process.poll() is None:
            kill_group(self.process)

    def restart(self, down_for: float = 0.3) -> None:
        self.kill()
        time.sleep(down_for)
        self.start()

    def log_text(self) -> str:
        return "\n".join(p.read_text(errors="replace")[-2000:] for p in sorted(self.folder.glob("redis-*.log")))


def delete_prefix(redis_url: str, prefix: str) -> None:
    """Delete every key under ``streamer:<prefix>:`` (a test's own keys on a
    shared server; never FLUSHALL)."""
    conn = redis.Redis.from_url(redis_url, socket_timeout=5)
    try:
        keys = list(conn.scan_iter(match=f"streamer:{prefix}:*", count=1000))
        if keys:
            conn.delete(*keys)
    finally:
        conn.close()
