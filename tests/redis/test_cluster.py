"""A Redis Cluster: ``redis+cluster://`` wherever a Redis URL is taken; the
keys of one model share a hash slot (its prefix is a hash tag), so the
scripts and transactions work, and models spread over the nodes.

A real three-master cluster on 127.0.0.1, made by the test: three
``redis-server --cluster-enabled yes`` and ``redis-cli --cluster create``."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Dict, Iterator, List, Tuple

import pytest
import redis

from streamer_core import RedisStreamer, RedisWorker
from streamer_core.backends.redis.wire import Keys
from streamer_core.options.redis_address import RedisAddress
from tests.core.models import double
from tests.helpers import stop_all, wait_for
from tests.redis.conftest import ThreadWorker
from tests.redis.models import with_pid
from tests.servers import RedisServer, free_ports, unavailable

ROOT = Path(__file__).resolve().parents[2]


class Cluster:
    """Three masters sharing the 16,384 slots, no replicas."""

    def __init__(self, folder: Path) -> None:
        # Each node's cluster bus on a free port of its own (not port + 10000,
        # which a free port above 55535 cannot have), its state in a file of its own.
        ports = free_ports(6)
        self.nodes = []
        for port, bus in zip(ports[:3], ports[3:]):
            args = [
                "--cluster-enabled",
                "yes",
                "--cluster-port",
                str(bus),
                "--cluster-config-file",
                f"nodes-{port}.conf",
            ]
            self.nodes.append(RedisServer(folder, port, extra_args=args))

    @property
    def url(self) -> str:
        return "redis+cluster://" + ",".join(f"127.0.0.1:{node.port}" for node in self.nodes)

    def start(self) -> None:
        for node in self.nodes:
            node.start()
        done = subprocess.run(
            ["redis-cli", "--cluster", "create", *(f"127.0.0.1:{n.port}" for n in self.nodes)]
            + ["--cluster-replicas", "0", "--cluster-yes"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0, done.stdout + done.stderr
        assert wait_for(self._ok, 30, interval=0.2), "the cluster did not reach cluster_state:ok"

    def _ok(self) -> bool:
        for node in self.nodes:
            with redis.Redis(port=node.port, socket_timeout=1) as conn:
                if conn.cluster("info").get("cluster_state") != "ok":
                    return False
        return True

    def node_of_slot(self, slot: int) -> int:
        """The port of the master that serves ``slot``."""
        with redis.Redis(port=self.nodes[0].port, socket_timeout=1) as conn:
            for start, end, master, *_ in conn.execute_command("CLUSTER SLOTS"):
                if start <= slot <= end:
                    return int(master[1])
        raise AssertionError(f"no node serves slot {slot}")

    def keys_by_port(self) -> Dict[int, List[str]]:
        found = {}
        for node in self.nodes:
            with redis.Redis(port=node.port, socket_timeout=1) as conn:
                found[node.port] = sorted(k.decode() for k in conn.scan_iter(match="streamer:*", count=1000))
        return found

    def stop(self) -> None:
        stop_all(node.kill for node in self.nodes)


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    if shutil.which("redis-server") is None or shutil.which("redis-cli") is None:
        unavailable("the Cluster tests need redis-server and redis-cli on PATH")
    folder = tmp_path / "cluster"
    folder.mkdir()
    made = Cluster(folder)
    try:
        made.start()
        yield made
    finally:
        made.stop()


def slot_of(prefix: str) -> int:
    from redis.crc import key_slot

    return int(key_slot(Keys(prefix, hash_tag=True).requests.encode()))


def two_prefixes_on_two_nodes(cluster: Cluster) -> Tuple[str, str]:
    first = "embed"
    for n in range(100):
        other = f"classify-{n}"
        if cluster.node_of_slot(slot_of(other)) != cluster.node_of_slot(slot_of(first)):
            return first, other
    raise AssertionError("no two prefixes on two nodes")


def test_the_url_and_the_keys():
    address = RedisAddress.parse("redis+cluster://:pw@127.0.0.1:7000,127.0.0.1:7001,[::1]")
    assert address.is_cluster and address.hosts == (("127.0.0.1", 7000), ("127.0.0.1", 7001), ("::1", 6379))
    assert address.password == "pw" and address.redacted == "redis+cluster://***@127.0.0.1:7000,127.0.0.1:7001,[::1]"
    assert not RedisAddress.parse("redis://127.0.0.1:6379/0").is_cluster
    for bad, message in (("redis+cluster://127.0.0.1:7000/3", "database 0 only"), ("redis+cluster:///", "no node")):
        with pytest.raises(ValueError, match=message):
            RedisAddress.parse(bad)
    keys = Keys("embed", hash_tag=True)
    assert keys.requests == "streamer:{embed}:requests" and keys.results("c1") == "streamer:{embed}:results:c1"
    assert Keys("embed").requests == "streamer:embed:requests"  # a single server: the names as before
    assert Keys("", hash_tag=True).workers == "streamer:{streamer}:workers"
    # Every key of a model carries its tag on a cluster, those written only
    # now and then too (the dead letters, the workers loading their model).
    names = [value for value in vars(keys).values() if isinstance(value, str) and value != keys.namespace]
    assert len(names) >= 5 and all(name.startswith("streamer:{embed}:") for name in names + [keys.results("c1")]), names


def test_two_routes_are_served_each_from_one_node(cluster: Cluster):
    """Two models on a three-master cluster: each answers right through the
    scripts and transactions; every key of one model is on one node, and
    the two models' keys on two nodes."""
    first, second = two_prefixes_on_two_nodes(cluster)
    workers = [
        ThreadWorker(RedisWorker(double, 8, redis_broker=cluster.url, prefix=first)),
        ThreadWorker(RedisWorker(with_pid, 8, redis_broker=cluster.url, prefix=second)),
    ]
    for worker in workers:
        worker.thread.start()
    streamers = [RedisStreamer(cluster.url, first, timeout=20), RedisStreamer(cluster.url, second, timeout=20)]
    try:
        assert all(streamer.wait_ready(20) for streamer in streamers)
        assert streamers[0].predict(list(range(50))) == [x * 2 for x in range(50)]
        answers = streamers[1].predict(list(range(50)))
        assert [x for x, _ in answers] == list(range(50)) and {pid for _, pid in answers} == {os.getpid()}
        futures = [streamers[i % 2].submit([i]) for i in range(200)]  # both at once, interleaved
        results = [future.result(20) for future in futures]
        assert [r[0] for r in results[0::2]] == [2 * i for i in range(0, 200, 2)]
        assert [r[0][0] for r in results[1::2]] == list(range(1, 200, 2))
        by_port = cluster.keys_by_port()
        tags = (f"{{{first}}}", f"{{{second}}}")
        untagged = [key for keys in by_port.values() for key in keys if not any(tag in key for tag in tags)]
        assert not untagged, f"keys without their model's hash tag: {untagged}"
        for prefix in (first, second):
            holders = {port for port, keys in by_port.items() if any(f"{{{prefix}}}" in key for key in keys)}
            assert holders == {cluster.node_of_slot(slot_of(prefix))}, (prefix, by_port)
        assert cluster.node_of_slot(slot_of(first)) != cluster.node_of_slot(slot_of(second))
    finally:
        for streamer in streamers:
            streamer.close()
        for worker in workers:
            worker.stop()


def test_the_status_command_names_each_routes_node(cluster: Cluster, tmp_path: Path):
    """``flask streamer status`` against a cluster: each route's node."""
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "FLASK_STREAMER_REDIS_URL": cluster.url,
        "FLASK_STREAMER_PREFIX": "status-on-cluster",
    }
    worker = ThreadWorker(RedisWorker(double, 8, redis_broker=cluster.url, prefix="status-on-cluster:double"))
    worker.thread.start()
    try:
        assert wait_for(lambda: RedisStreamer(cluster.url, "status-on-cluster:double").wait_ready(1), 20)
        done = subprocess.run(
            [sys.executable, "-m", "flask", "--app", "tests.flask.apps:create_redis_app()", "streamer", "status"]
            + ["--json"],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        report = json.loads(done.stdout)
        double_route = report["models"]["double"]
        slot = slot_of("status-on-cluster:double")
        assert double_route["slot"] == slot and double_route["node"] == f"127.0.0.1:{cluster.node_of_slot(slot)}"
        assert len(double_route["workers"]) == 1, double_route
        assert {report["models"][name]["node"] for name in report["models"]} <= {
            f"127.0.0.1:{node.port}" for node in cluster.nodes
        }
    finally:
        worker.stop()
