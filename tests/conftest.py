"""Shared fixtures: streamers that are always closed, a gate that holds a
thread-backend model busy until the test releases it, and a Redis server
for the whole session (``redis_url``)."""

from __future__ import annotations

import functools
import os
import shutil
import sys
import threading
from typing import Any, Callable, Iterator, List

import pytest
from hypothesis import HealthCheck, settings

from tests.helpers import stop_all

# The property tests check what the code does, never how fast: on a shared
# machine under load (stress --cpu 8) hypothesis's own timing checks (a
# deadline per example, data generated too slowly) fail them for nothing.
settings.register_profile("shared-machine", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("shared-machine")


#: The longest a Gate holds its model for a test (seconds): 100,000 calls
#: timing out under tracemalloc (tests/core/test_timeouts.py) took past 30 s
#: beside stress --cpu 8, and the gate gave way under it.
GATE_HOLD_S = 180


class Gate:
    """A model for ThreadedStreamer that records every batch, and blocks on
    inputs equal to ``"hold"`` until ``release()``."""

    def __init__(self) -> None:
        self.open = threading.Event()
        self.entered = threading.Event()
        self.batches: List[List[Any]] = []

    def __call__(self, batch: List[Any]) -> List[Any]:
        self.batches.append(list(batch))
        if "hold" in batch:
            self.entered.set()
            assert self.open.wait(GATE_HOLD_S), "the test never released the gate"
        return [f"ok:{x}" for x in batch]

    def release(self) -> None:
        self.open.set()

    def seen(self) -> List[Any]:
        return [x for batch in self.batches for x in batch]


@pytest.fixture(autouse=True)
def no_gevent_hub_left() -> Iterator[None]:
    """No test leaves a gevent hub in the pytest process: with one, every
    later wait of the process would go through it, and the tests that wait
    under gevent run in subprocesses of their own for that reason."""
    yield
    local = sys.modules.get("gevent._hub_local")
    if local is not None:
        assert local.get_hub_if_exists() is None, "this test started a gevent hub in the pytest process"


@pytest.fixture
def gate() -> Iterator[Gate]:
    g = Gate()
    yield g
    g.release()


@pytest.fixture
def closing() -> Iterator[Callable[[Any], Any]]:
    """Register a streamer to be closed at the end of the test, whatever happens."""
    made: List[Any] = []

    def register(streamer: Any) -> Any:
        made.append(streamer)
        return streamer

    yield register
    stop_all(functools.partial(streamer.close, timeout=5) for streamer in made)  # each, whatever one raised


@pytest.fixture(scope="session")
def redis_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``$REDIS_URL``, else a private redis-server for the whole session."""
    import redis

    from tests.servers import RedisServer, unavailable

    url = os.environ.get("REDIS_URL")
    if url:
        client = redis.Redis.from_url(url, socket_connect_timeout=2)
        try:
            client.ping()
        except redis.RedisError as exc:
            unavailable(f"REDIS_URL={url} does not answer: {exc}")
        finally:
            client.close()
        yield url
        return
    if shutil.which("redis-server") is None:
        unavailable("no Redis for the Redis backend tests: set REDIS_URL or put redis-server on PATH")
    server = RedisServer(tmp_path_factory.mktemp("redis-session"))
    try:
        try:
            server.start()
        except RuntimeError as exc:
            unavailable(f"could not start redis-server: {exc}")
        yield server.url
    finally:
        server.kill()
