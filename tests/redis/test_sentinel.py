"""Redis behind Sentinel: a ``redis+sentinel://`` URL wherever a Redis URL
is taken, and a failover under load that the web processes and workers
follow by themselves.

Every server here is a real ``redis-server`` on 127.0.0.1, started by the
test: one master, one replica, three Sentinels (``redis-server
sentinel.conf --sentinel``) that agree (quorum 2) the master is down after
four seconds without an answer."""

from __future__ import annotations

import functools
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Optional

import pytest
import redis

from streamer_core import RedisStreamer, RedisWorker
from streamer_core.backends.redis.client import SEND_RETRY_S
from streamer_core.errors import BrokerUnavailableError, ConfigurationError
from streamer_core.options.redis_address import RedisAddress
from tests.core.models import double
from tests.helpers import stop_all, stop_each, wait_for
from tests.redis.conftest import ThreadWorker
from tests.servers import RedisServer, free_port, free_ports, unavailable

ROOT = Path(__file__).resolve().parents[2]
SERVICE = "mymaster"
# Long enough for an outage past the web side's NO_WORKER_S: the time Redis
# cannot be asked must not be taken for time without workers.
DOWN_AFTER_MS = 4000


class SentinelSet:
    """A master, its replica and three Sentinels watching them, on free ports."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        master_port, self.replica_port, *self.sentinel_ports = free_ports(5)
        self.master = RedisServer(folder, master_port)
        self.replica: Optional[RedisServer] = None
        self.sentinels: List[subprocess.Popen] = []

    @property
    def url(self) -> str:
        hosts = ",".join(f"127.0.0.1:{port}" for port in self.sentinel_ports)
        return f"redis+sentinel://{hosts}/{SERVICE}/0"

    def start(self) -> None:
        exe = shutil.which("redis-server")
        assert exe is not None
        self.master.start()
        replica_of = ["--replicaof", "127.0.0.1", str(self.master.port)]
        self.replica = RedisServer(self.folder, self.replica_port, extra_args=replica_of)
        self.replica.start()
        for port in self.sentinel_ports:
            conf = self.folder / f"sentinel-{port}.conf"
            conf.write_text(
                f"port {port}\nbind 127.0.0.1\ndir {self.folder}\n"
                f"sentinel monitor {SERVICE} 127.0.0.1 {self.master.port} 2\n"
                f"sentinel down-after-milliseconds {SERVICE} {DOWN_AFTER_MS}\n"
                f"sentinel failover-timeout {SERVICE} 4000\n"
                f"sentinel parallel-syncs {SERVICE} 1\n"
            )
            log = open(self.folder / f"sentinel-{port}.log", "wb")
            with log:
                self.sentinels.append(
                    subprocess.Popen(
                        [exe, str(conf), "--sentinel"], stdout=log, stderr=subprocess.STDOUT, start_new_session=True
                    )
                )
        # Ready when every Sentinel knows the replica, the two other
        # Sentinels, and the replica is in sync.
        assert wait_for(self._agreed, 60, interval=0.2), "the Sentinels did not agree on the master and its replica"

    def _agreed(self) -> bool:
        assert self.replica is not None
        try:
            for port in self.sentinel_ports:
                with redis.Redis(port=port, socket_timeout=1, decode_responses=True) as conn:
                    master = conn.sentinel_master(SERVICE)
                    if master["num-slaves"] < 1 or master["num-other-sentinels"] < 2:
                        return False
            with redis.Redis(port=self.replica.port, socket_timeout=1, decode_responses=True) as conn:
                return bool(conn.info("replication").get("master_link_status") == "up")
        except redis.RedisError:
            return False

    def master_port(self) -> int:
        with redis.Redis(port=self.sentinel_ports[0], socket_timeout=1) as conn:
            _, port = conn.sentinel_get_master_addr_by_name(SERVICE)
        return int(port)

    def stop(self) -> None:
        servers = [server for server in (self.master, self.replica) if server is not None]
        stop_all([functools.partial(stop_each, self.sentinels), *(server.kill for server in servers)])


@pytest.fixture
def sentinel_set(tmp_path: Path) -> Iterator[SentinelSet]:
    if shutil.which("redis-server") is None:
        unavailable("the Sentinel tests need redis-server on PATH")
    folder = tmp_path / "sentinel"
    folder.mkdir()
    servers = SentinelSet(folder)
    try:
        servers.start()
        yield servers
    finally:
        servers.stop()


# -- the URL ---------------------------------------------------------------------


def test_the_url_names_the_sentinels_the_service_and_the_database():
    address = RedisAddress.parse(
        "redis+sentinel://:s3cret@10.0.0.1:26379,[::1]:26380,sentinel-c/cache/2?sentinel_password=x"
    )
    assert address.is_sentinel and not address.is_cluster
    assert address.hosts == (("10.0.0.1", 26379), ("::1", 26380), ("sentinel-c", 26379))
    assert (address.service, address.db, address.password, address.sentinel_password) == ("cache", 2, "s3cret", "x")
    assert "s3cret" not in address.redacted and "s3cret" not in str(address)
    assert not RedisAddress.parse("redis://127.0.0.1:6379/0").is_sentinel


@pytest.mark.parametrize(
    "url, message",
    [
        ("redis+sentinel:///mymaster", "names no Sentinel"),
        ("redis+sentinel://127.0.0.1:26379", "must name the service"),
        ("redis+sentinel://127.0.0.1:26379/mymaster/zero", "the database must be a number"),
        ("redis+sentinel://127.0.0.1:port/mymaster", "is not host:port"),
        ("redis+sentinel://127.0.0.1/mymaster?master_password=x", "unknown parameter"),
        ("rediss+sentinel://127.0.0.1/mymaster", "not supported"),
        ("just-a-host", "redis+sentinel://"),
    ],
)
def test_a_wrong_url_says_how_to_write_it(url, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        RedisAddress.parse(url)
    with pytest.raises(ValueError, match=re.escape(message)):
        RedisStreamer(url, "p")


def test_a_password_in_a_wrong_url_is_not_printed():
    with pytest.raises(ValueError) as raised:
        RedisAddress.parse("redis+sentinel://:hunter2@127.0.0.1/mymaster/x")
    assert "hunter2" not in str(raised.value)


# -- serving through Sentinel ------------------------------------------------------


def test_streamer_and_worker_find_the_master_through_sentinel(sentinel_set: SentinelSet):
    worker = ThreadWorker(RedisWorker(double, 8, redis_broker=sentinel_set.url, prefix="through-sentinel"))
    worker.thread.start()
    streamer = RedisStreamer(sentinel_set.url, "through-sentinel", timeout=20)
    try:
        assert streamer.wait_ready(20)
        assert streamer.predict(list(range(20))) == [x * 2 for x in range(20)]
        with redis.Redis(port=sentinel_set.master.port) as conn:  # the requests went to the master
            assert conn.exists("streamer:through-sentinel:requests")
    finally:
        streamer.close()
        worker.stop()


def test_the_sentinels_get_their_password_and_the_master_its_own(tmp_path: Path):
    """Sentinels with a password of their own (``requirepass`` in
    sentinel.conf) watching a master with another: the URL's password goes
    to the master, ``sentinel_password`` to the Sentinels, and a streamer
    and a worker serve through them. Either password given to the wrong
    side is refused."""
    if shutil.which("redis-server") is None:
        unavailable("the Sentinel tests need redis-server on PATH")
    master_port, sentinel_port = free_ports(2)
    master = RedisServer(tmp_path, master_port, extra_args=["--requirepass", "master-pw"])
    conf = tmp_path / "sentinel.conf"
    conf.write_text(
        f"port {sentinel_port}\nbind 127.0.0.1\ndir {tmp_path}\nrequirepass sentinel-pw\n"
        f"sentinel monitor {SERVICE} 127.0.0.1 {master_port} 1\n"
        f"sentinel auth-pass {SERVICE} master-pw\n"
    )
    exe = shutil.which("redis-server")
    assert exe is not None
    url = f"redis+sentinel://:master-pw@127.0.0.1:{sentinel_port}/{SERVICE}/0?sentinel_password=sentinel-pw"
    swapped = f"redis+sentinel://:sentinel-pw@127.0.0.1:{sentinel_port}/{SERVICE}/0?sentinel_password=master-pw"
    sentinels: List[subprocess.Popen] = []
    worker: Optional[ThreadWorker] = None
    streamer: Optional[RedisStreamer] = None
    try:
        master.start()
        with open(tmp_path / "sentinel.log", "wb") as log:
            sentinels.append(
                subprocess.Popen([exe, str(conf), "--sentinel"], stdout=log, stderr=subprocess.STDOUT,
                                 start_new_session=True)
            )  # fmt: skip
        worker = ThreadWorker(RedisWorker(double, 8, redis_broker=url, prefix="passwords"))

        def sentinel_knows_the_master() -> bool:
            try:
                with redis.Redis(port=sentinel_port, password="sentinel-pw", socket_timeout=1) as conn:
                    return bool(conn.sentinel_get_master_addr_by_name(SERVICE))
            except redis.RedisError:
                return False

        assert wait_for(sentinel_knows_the_master, 30, interval=0.1)
        worker.thread.start()
        streamer = RedisStreamer(url, "passwords", timeout=20)
        assert streamer.wait_ready(20)
        assert streamer.predict([1, 2, 3]) == [2, 4, 6]
        # The Sentinels refuse the master's password (redis-py takes that for a
        # Sentinel that does not answer); the master refuses the Sentinels',
        # a setting to fix, said as the streamer starts.
        master_wrong = (
            f"redis+sentinel://:sentinel-pw@127.0.0.1:{sentinel_port}/{SERVICE}/0?sentinel_password=sentinel-pw"
        )
        with RedisStreamer(swapped, "passwords", timeout=5) as refused:
            with pytest.raises(BrokerUnavailableError, match="sentinel_password"):
                refused.live_workers()
        with pytest.raises(ConfigurationError, match="Redis refused this client.*check the password"):
            RedisStreamer(master_wrong, "passwords", timeout=5)
        # The master gone, the Sentinel still names it: a call is refused
        # with words that fit a failover, not a misconfiguration.
        master.kill()
        with pytest.raises(
            BrokerUnavailableError, match="the Redis master cannot be reached.*failover may be under way"
        ):
            streamer.predict([4])
    finally:
        stops: List[Callable[[], Any]] = [streamer.close] if streamer is not None else []
        stops += [worker.stop] if worker is not None else []
        stop_all([*stops, functools.partial(stop_each, sentinels), master.kill])


def test_what_went_wrong_behind_sentinels_is_said_as_a_possible_failover():
    import redis.sentinel

    from streamer_core.backends.redis.connection import broker_problem

    sentinels = RedisAddress.parse("redis+sentinel://127.0.0.1:26379/mymaster/0")
    server = RedisAddress.parse("redis://127.0.0.1:6379/0")
    lost = redis.ConnectionError("Error 111 connecting to 127.0.0.1:6380. Connection refused.")
    assert "failover may be under way" in broker_problem(lost, sentinels)
    assert broker_problem(lost, server).startswith("Redis cannot be reached (Error 111")
    no_master = redis.sentinel.MasterNotFoundError("No master found for 'mymaster' : <client>")
    said = broker_problem(no_master, sentinels)
    assert said.startswith("no Sentinel names a master for 'mymaster' now: a failover may be under way"), said
    assert "<client>" not in said and "sentinel_password" in said


def test_with_no_sentinel_answering_calls_fail_fast_with_a_503_error(tmp_path: Path):
    url = f"redis+sentinel://127.0.0.1:{free_port()}/{SERVICE}/0"
    streamer = RedisStreamer(url, "nobody", timeout=5)
    try:
        started = time.monotonic()
        with pytest.raises(BrokerUnavailableError, match="not queued"):
            streamer.predict([1])
        assert time.monotonic() - started < 5
    finally:
        streamer.close()


# -- a failover under load -----------------------------------------------------------


@dataclass
class Outcome:
    sent: int
    status: int  # -1: no HTTP answer
    body: Any
    started: float
    seconds: float


@dataclass
class Load:
    """Clients posting numbers to /double one after another until told to stop."""

    port: int
    clients: int
    timeout_s: float
    outcomes: List[Outcome] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def run(self) -> List[threading.Thread]:
        threads = [threading.Thread(target=self._client, args=(c,), daemon=True) for c in range(self.clients)]
        for thread in threads:
            thread.start()
        return threads

    def _client(self, c: int) -> None:
        k = 0
        while not self.stop.is_set():
            x = c * 1_000_000 + k
            k += 1
            started = time.monotonic()
            request = urllib.request.Request(
                f"http://127.0.0.1:{self.port}/double", json.dumps(x).encode(), {"Content-Type": "application/json"}
            )
            try:
                with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                    status, body = response.status, json.loads(response.read())
            except urllib.error.HTTPError as exc:
                status, body = exc.code, json.loads(exc.read() or b"null")
            except Exception as exc:  # no HTTP answer at all: counted as lost
                status, body = -1, f"{type(exc).__name__}: {exc}"
            with self._lock:
                self.outcomes.append(Outcome(x, status, body, started, time.monotonic() - started))
            if status != 200:
                time.sleep(0.05)


def start(argv: List[str], env: Dict[str, str], log: Path) -> subprocess.Popen:
    with open(log, "wb") as out:
        return subprocess.Popen(
            argv, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True,
        )  # fmt: skip


def test_a_failover_under_load_is_followed_and_loses_nothing(sentinel_set: SentinelSet, tmp_path: Path):
    """Kill the master under load from a real web process (gunicorn) and
    real workers (``flask streamer run-workers``): the Sentinels promote the
    replica, and both sides follow it without a restart. Every request gets
    an HTTP answer within its timeout; every 200 is its own input doubled;
    none waits out its timeout (what was in flight is sent again to the new
    master); a call refused while no master answers is refused within
    SEND_RETRY_S with a BrokerUnavailableError that says a failover may be
    under way, never a NoWorkerError (the workers run throughout); every
    call started after the promotion is answered."""
    prefix = "failover"
    timeout_s = 15
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "PYTHONUNBUFFERED": "1",
        "FLASK_STREAMER_REDIS_URL": sentinel_set.url,
        "FLASK_STREAMER_PREFIX": prefix,
        "FLASK_STREAMER_TIMEOUT": str(timeout_s),
    }
    app = "tests.flask.apps:create_redis_app()"
    port = free_port()
    started: List[subprocess.Popen] = []
    try:
        started.append(
            start(
                [sys.executable, "-m", "flask", "--app", app, "streamer", "run-workers", "--route", "double",
                 "--workers", "2"],
                env,
                tmp_path / "workers.log",
            )
        )  # fmt: skip
        started.append(
            start(
                [sys.executable, "-m", "gunicorn", "-b", f"127.0.0.1:{port}", "-k", "gthread", "--threads", "16",
                 app],
                env,
                tmp_path / "web.log",
            )
        )  # fmt: skip

        def answers() -> bool:
            try:
                request = urllib.request.Request(
                    f"http://127.0.0.1:{port}/double", b"21", {"Content-Type": "application/json"}
                )
                with urllib.request.urlopen(request, timeout=5) as response:
                    return bool(json.loads(response.read()) == 42)
            except Exception:
                return False

        assert wait_for(answers, 60, interval=0.2), (tmp_path / "web.log").read_text()[-3000:]
        load = Load(port, clients=12, timeout_s=timeout_s + 10)
        threads = load.run()
        time.sleep(2)
        old_port = sentinel_set.master.port
        killed_at = time.monotonic()
        sentinel_set.master.kill()
        assert sentinel_set.replica is not None
        assert wait_for(lambda: sentinel_set.master_port() == sentinel_set.replica.port, 30, interval=0.1)
        promoted_at = time.monotonic()
        # Load on the new master for a while: both sides must have followed.
        time.sleep(6)
        load.stop.set()
        for thread in threads:
            thread.join(timeout_s + 15)
        assert not any(thread.is_alive() for thread in threads), "a client never got an answer"
        outcomes = load.outcomes
        statuses: Dict[int, int] = {}
        for outcome in outcomes:
            statuses[outcome.status] = statuses.get(outcome.status, 0) + 1

        def web_log() -> str:
            return (tmp_path / "web.log").read_text()

        resent = sum(int(n) for n in re.findall(r"sending (\d+) unanswered requests again", web_log()))
        report = (
            f"{len(outcomes)} requests, statuses {statuses}, failover took {promoted_at - killed_at:.1f} s "
            f"(master {old_port} -> {sentinel_set.replica.port}), sent again {resent}"
        )
        print(report)
        lost = [o for o in outcomes if o.status == -1]
        assert not lost, f"requests without an HTTP answer: {[o.body for o in lost[:5]]}; {report}"
        wrong = [o for o in outcomes if o.status == 200 and o.body != o.sent * 2]
        assert not wrong, f"answers that were not their own: {[(o.sent, o.body) for o in wrong[:5]]}; {report}"
        # Nothing waited out its timeout: what the old master held was sent
        # again to the new one and answered there.
        others = [o for o in outcomes if o.status not in (200, 503)]
        assert not others, f"unexpected answers: {[(o.status, o.body) for o in others[:5]]}; {report}"
        assert resent >= 1, f"nothing was sent again to the promoted replica; {report}"
        assert "another Redis server answers now (a restart, or a failover to a replica)" in web_log(), report
        # Every refusal says Redis is the problem (the workers ran throughout),
        # and came within SEND_RETRY_S of the call (with room for HTTP and a busy machine).
        refused = [o for o in outcomes if o.status == 503]
        wrong_kind = [o.body for o in refused if o.body["error"]["type"] != "BrokerUnavailableError"]
        assert not wrong_kind, f"refusals that blame something else than Redis: {wrong_kind[:3]}; {report}"
        assert all("failover may be under way" in o.body["error"]["message"] for o in refused), refused[:3]
        slow = [round(o.seconds, 2) for o in refused if o.seconds > SEND_RETRY_S + 0.75]
        assert not slow, f"refusals that took longer than {SEND_RETRY_S}s of retries: {slow[:5]}; {report}"
        late = [o for o in outcomes if o.seconds > timeout_s + 3]
        assert not late, f"calls that waited past their timeout: {[round(o.seconds, 1) for o in late[:5]]}; {report}"
        after = [o for o in outcomes if o.started > promoted_at]
        assert after and all(o.status == 200 for o in after), (
            f"after the failover: {[(o.status, o.body) for o in after if o.status != 200][:5]}; {report}"
        )
        assert sum(o.started < killed_at and o.status == 200 for o in outcomes) > 0, report
    finally:
        stop_each(started)
