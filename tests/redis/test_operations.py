"""Operating the Redis backend: the workers' own metrics (``--metrics-port``),
readiness as workers come and go, and the status command against a real
Redis with workers up and down."""

from __future__ import annotations

import json
import os
import signal
import time
import urllib.request
from typing import Any, Callable, Dict, Tuple

import redis
from flask import Flask

from flask_streamer import FlaskStreamer
from streamer_core import NoWorkerError
from streamer_core.web.status import model_status
from tests.helpers import metric_samples
from tests.redis.conftest import Broker, Processes, ThreadWorker, free_port, wait_for, wait_serving, worker_children
from tests.redis.models import identity


def scrape(port: int) -> Dict[Tuple[str, Tuple[Tuple[str, str], ...]], float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        return metric_samples(response.read().decode())


def redis_app(broker: Broker, metrics: bool = False) -> Flask:
    """An app of one batched route on the Redis backend, with ``/readyz``
    (and ``/metrics`` where ``metrics``)."""
    app = Flask(f"ops-{broker.prefix}")
    app.config.update(
        STREAMER_BACKEND="redis",
        STREAMER_REDIS_URL=broker.url,
        STREAMER_READY_ROUTE="/readyz",
        STREAMER_METRICS_ROUTE="/metrics" if metrics else None,
        STREAMER_TIMEOUT=10,
    )
    streamer = FlaskStreamer(app)
    streamer.add_batched_route("/identity", "identity", identity, prefix=broker.prefix)
    return app


def test_worker_metrics_add_up_over_the_supervisors_workers(
    broker: Broker, procs: Processes, make_streamer: Callable[..., Any]
) -> None:
    port = free_port()
    cli = procs.cli(broker, "tests.redis.models:with_batch", "--workers", "2", "--metrics-port", str(port))
    assert wait_for(lambda: len(worker_children(cli.pid)) == 2, 30)
    wait_serving(procs, cli, worker_children(cli.pid))
    streamer = make_streamer(broker, name="web")
    for start in range(0, 90, 9):
        assert [x for x, _ in streamer.predict(list(range(start, start + 9)))] == list(range(start, start + 9))
    model = ("model", broker.prefix)  # a bare command's model is named by its prefix
    found = wait_for(lambda: (f := scrape(port)).get(("streamer_batch_size_sum", (model,))) == 90 and f, 10)
    assert found, scrape(port)
    assert found[("streamer_queue_wait_seconds_count", (model,))] == 90
    batches = found[("streamer_batch_size_count", (model,))]
    # Each call runs in one batch or more: the calls were made one after another.
    assert found[("streamer_model_seconds_count", (model,))] == batches >= 10
    assert wait_for(lambda: scrape(port)[("streamer_workers_live", (model,))] == 2, 5)
    # Each worker counts itself on its device (none given here), added up as well.
    assert scrape(port)[("streamer_workers_live_by_device", (("device", "default"), model))] == 2
    # The web side counts the calls, under its own name.
    assert streamer.stats().requests["ok"] == 10
    assert streamer.stats().workers_live == 2


def test_readiness_follows_the_workers(
    broker: Broker, procs: Processes, start_worker: Callable[..., ThreadWorker]
) -> None:
    client = redis_app(broker).test_client()
    before = client.get("/readyz")
    assert before.status_code == 503
    assert "no worker serves" in before.json["models"]["identity"]["reason"]
    worker = procs.worker(broker, "identity")
    wait_serving(procs, worker, [worker.pid])
    assert wait_for(lambda: client.get("/readyz").status_code == 200, 5)
    assert client.post("/identity", json=5).json == 5
    os.kill(worker.pid, signal.SIGKILL)
    # Taken for dead once it has not beaten for PRESENCE_MS (3 s).
    after = wait_for(lambda: (r := client.get("/readyz")).status_code == 503 and r, 10)
    assert after and "no worker serves" in after.json["models"]["identity"]["reason"]


def test_readiness_when_redis_is_down(fault_broker: Broker, start_worker: Callable[..., ThreadWorker]) -> None:
    client = redis_app(fault_broker).test_client()
    start_worker(fault_broker, identity)
    assert wait_for(lambda: client.get("/readyz").status_code == 200, 10)
    assert fault_broker.server is not None
    fault_broker.server.kill()
    response = client.get("/readyz")
    assert response.status_code == 503
    reason = response.json["models"]["identity"]["reason"]
    assert "Redis" in reason or "redis" in reason, reason


def test_readiness_when_redis_refuses_the_probes_command(
    fault_broker: Broker, start_worker: Callable[..., ThreadWorker]
) -> None:
    """Redis answers, with an error the streamer does not take for Redis
    being away: here its user may no longer run scripts (a managed Redis's
    ACL), so the probe's question fails with NOPERM. The model is not ready,
    and the answer names the error, rather than passing for ready."""
    client = redis_app(fault_broker).test_client()
    start_worker(fault_broker, identity)
    assert wait_for(lambda: client.get("/readyz").status_code == 200, 10)
    admin = redis.Redis.from_url(fault_broker.url)
    admin.execute_command("ACL", "SETUSER", "default", "-eval", "-evalsha")
    try:
        response = client.get("/readyz")
    finally:
        admin.execute_command("ACL", "SETUSER", "default", "+@all")
        admin.close()
    assert response.status_code == 503, response.json
    reason = response.json["models"]["identity"]["reason"]
    assert "NoPermissionError" in reason and "eval" in reason.lower(), reason


def test_metrics_and_status_answer_soon_while_redis_is_frozen(
    fault_broker: Broker, start_worker: Callable[..., ThreadWorker]
) -> None:
    """Redis stopped (SIGSTOP): it takes connections and answers nothing.
    A scrape of ``/metrics`` and the status command (a container's health
    check) answer within seconds, saying Redis does not answer, rather than
    waiting on it (a scrape had no answer in 100 s, the status took 80 s)."""
    app = redis_app(fault_broker, metrics=True)
    client, runner = app.test_client(), app.test_cli_runner()
    start_worker(fault_broker, identity)
    assert wait_for(lambda: client.get("/readyz").status_code == 200, 10)
    assert client.get("/metrics").status_code == 200
    assert fault_broker.server is not None and fault_broker.server.process is not None
    os.kill(fault_broker.server.process.pid, signal.SIGSTOP)
    try:
        started = time.monotonic()
        scraped = client.get("/metrics")
        took = time.monotonic() - started
        assert scraped.status_code == 200 and took < 5, took
        found = metric_samples(scraped.get_data(as_text=True))
        assert ("streamer_redis_pending", (("model", "identity"),)) not in found, "a number nobody knows"
        started = time.monotonic()
        status = runner.invoke(args=["streamer", "status", "--json"])
        took = time.monotonic() - started
        assert status.exit_code == 1 and took < 5, (took, status.output)
        [problem] = json.loads(status.output)["models"]["identity"]["problems"]
        assert "Redis" in problem, problem
    finally:
        os.kill(fault_broker.server.process.pid, signal.SIGCONT)


def test_a_question_someone_waits_on_is_asked_once_for_a_second(broker: Broker) -> None:
    """What the test above bounds loosely, exactly: the connection of
    ``/metrics`` and the status commands waits ASK_TIMEOUT_S a command and
    does not try again (a retry doubled every wait on a frozen Redis); the
    serving connections keep their ten seconds and one retry."""
    from streamer_core.backends.redis.connection import ASK_TIMEOUT_S, connect
    from streamer_core.options.redis_address import RedisAddress

    address = RedisAddress.of(broker.url)
    asking, serving = connect(address, asking=True), connect(address)
    try:
        assert ASK_TIMEOUT_S == 1.0
        assert asking.connection_pool.connection_kwargs["socket_timeout"] == ASK_TIMEOUT_S
        assert asking.get_retry().get_retries() == 0
        assert serving.connection_pool.connection_kwargs["socket_timeout"] == 10.0
        assert serving.get_retry().get_retries() == 1
    finally:
        asking.close()
        serving.close()


def test_status_command_with_workers_up_and_down(
    broker: Broker, start_worker: Callable[..., ThreadWorker], make_streamer: Callable[..., Any]
) -> None:
    app = redis_app(broker)
    runner = app.test_cli_runner()
    down = runner.invoke(args=["streamer", "status"])
    assert down.exit_code == 1, down.output
    assert "identity [redis] PROBLEM" in down.output and "no live worker serves" in down.output
    assert "start them (flask streamer run-workers or streamer-worker)" in down.output, "Flask's command"

    # Requests waiting with no worker: counted, and the oldest one's age.
    waiting = make_streamer(broker, timeout=30)
    futures = [waiting.submit([x]) for x in range(3)]
    broker.wait_queued(3)
    report = json.loads(runner.invoke(args=["streamer", "status", "--json"]).output)
    assert report["ok"] is False and report["models"]["identity"]["waiting"] == 3
    assert report["models"]["identity"]["oldest_waiting_s"] >= 0

    worker = start_worker(broker, identity)
    assert [f.result(10) for f in futures] == [[0], [1], [2]]
    up = runner.invoke(args=["streamer", "status", "--json"])
    assert up.exit_code == 0, up.output
    model = json.loads(up.output)["models"]["identity"]
    assert model["waiting"] == 0 and model["pending"] == 0 and model["oldest_waiting_s"] is None
    [info] = model["workers"]
    assert info["pid"] == os.getpid() and info["host"] and info["last_beat_s"] < 3
    assert worker.worker.consumer == info["name"]
    worker.stop()
    assert runner.invoke(args=["streamer", "status"]).exit_code == 1


def test_status_stops_counting_a_killed_worker_once_its_beats_are_stale(broker: Broker, procs: Processes) -> None:
    """A worker killed without a word (SIGKILL, its host gone) stays in the
    presence set until it is forgotten, a minute later; the status command
    (a container's health check) counts it live only while its last beat
    is younger than PRESENCE_MS, then says no worker serves and exits 1."""
    from streamer_core.backends.redis.wire import PRESENCE_MS

    runner = redis_app(broker).test_cli_runner()
    worker = procs.worker(broker, "identity")
    wait_serving(procs, worker, [worker.pid])
    up = runner.invoke(args=["streamer", "status", "--json"])
    assert up.exit_code == 0, up.output
    assert [w["pid"] for w in json.loads(up.output)["models"]["identity"]["workers"]] == [worker.pid]
    os.kill(worker.pid, signal.SIGKILL)
    worker.wait(10)
    time.sleep(PRESENCE_MS / 1000 + 1)
    down = runner.invoke(args=["streamer", "status", "--json"])
    assert down.exit_code == 1, down.output
    model = json.loads(down.output)["models"]["identity"]
    assert model["workers"] == [], model
    assert any("no live worker serves" in problem for problem in model["problems"]), model


def test_status_exits_1_when_any_route_cannot_serve(broker: Broker) -> None:
    """A thread-backend route served beside a Redis route with no worker:
    the command exits 1 (a probe or deploy script reads it), naming which."""
    app = Flask(f"ops-mixed-{broker.prefix}")
    app.config.update(STREAMER_BACKEND="redis", STREAMER_REDIS_URL=broker.url, STREAMER_TIMEOUT=10)
    streamer = FlaskStreamer(app)
    streamer.add_batched_route("/identity", "identity", identity, prefix=broker.prefix)
    streamer.add_batched_route("/local", "local", identity, backend="thread")
    done = app.test_cli_runner().invoke(args=["streamer", "status"])
    assert done.exit_code == 1, done.output
    assert "local [thread] ok:" in done.output and "identity [redis] PROBLEM" in done.output, done.output


def test_status_tells_live_workers_from_the_configured_number(
    broker: Broker, start_worker: Callable[..., ThreadWorker]
) -> None:
    """Two workers live while ``worker_num`` says 1: the header line must not
    claim one worker, and the count of live ones is said apart from it."""
    app = redis_app(broker)
    runner = app.test_cli_runner()
    start_worker(broker, identity)
    start_worker(broker, identity)
    handle = next(iter(app.extensions["streamer"].handles.values()))
    assert wait_for(lambda: len(model_status(handle.spec).workers) == 2, 5)
    output = runner.invoke(args=["streamer", "status"]).output
    header = output.splitlines()[0]
    assert header.startswith("identity [redis] ok:") and "worker_num" not in header, output
    assert "  live workers: 2 (configured: worker_num=1 per run-workers command)" in output.splitlines(), output
    report = json.loads(runner.invoke(args=["streamer", "status", "--json"]).output)["models"]["identity"]
    assert len(report["workers"]) == 2 and report["configured_workers"] == 1
    assert "worker_num" not in report["settings"]


def test_status_reads_a_garbled_worker_info_safely(broker: Broker, start_worker: Callable[..., ThreadWorker]) -> None:
    start_worker(broker, identity)
    spec = redis_app(broker).extensions["streamer"].handles
    [handle] = spec.values()
    assert wait_for(lambda: model_status(handle.spec).ok, 5)
    key = f"streamer:{broker.prefix}:worker-info"
    for value in [b"\xff\xfe", b"[1, 2]", b'{"pid": "x", "host": 3}']:
        for name in broker.conn.hkeys(key):
            broker.conn.hset(key, name, value)
        status = model_status(handle.spec)
        assert status.ok and len(status.workers) == 1
        assert status.workers[0].pid == os.getpid()  # from the worker's name, host-pid-random


def test_web_side_counts_calls_refused_for_want_of_workers(broker: Broker, make_streamer: Callable[..., Any]) -> None:
    streamer = make_streamer(broker, require_workers=True, name=f"refused-{broker.prefix}")
    try:
        streamer.predict([1])
    except NoWorkerError:
        pass
    assert streamer.stats().requests["unavailable"] == 1


def test_a_worker_loading_its_model_is_told_apart_from_no_worker(
    broker: Broker, start_worker: Callable[..., ThreadWorker], tmp_path: Any
) -> None:
    """What a newcomer met on the README's Redis recipe: for the 11 s the
    workers loaded the model, every call got "no worker serves ...: start
    workers" (they had been started). A worker says it is loading as it
    starts: calls get a 503 saying so, with a Retry-After of the load so
    far; readiness and the status command say why; then it serves."""
    from tests.redis.models import GatedLoadModel

    app = redis_app(broker)
    client, runner = app.test_client(), app.test_cli_runner()
    worker = start_worker(broker, GatedLoadModel, model_init_kwargs={"folder": str(tmp_path)})
    assert wait_for(lambda: broker.conn.zcard(f"streamer:{broker.prefix}:loading") == 1, 10), "never said it loads"
    response = client.post("/identity", json=5)
    error = response.json["error"]
    assert error["type"] == "NoWorkerError" and "is loading on 1 worker(s)" in error["message"], error
    assert "start workers" not in error["message"]
    first = int(response.headers["Retry-After"])
    # The load so far (under a second here, a few on a busy machine), at least 1.
    assert 1 <= first <= 5, f"Retry-After {first}: not the load so far"
    time.sleep(1.2)
    later = client.post("/identity", json=5)
    assert int(later.headers["Retry-After"]) >= max(2, first + 1), "the Retry-After grows with the load so far"
    ready = client.get("/readyz")
    assert ready.status_code == 503 and "loading" in ready.json["models"]["identity"]["reason"], ready.json
    status = runner.invoke(args=["streamer", "status"])
    assert status.exit_code == 1 and "workers loading the model: 1" in status.output, status.output
    assert "no worker serves" in status.output and "loading the model, the longest for" in status.output
    (tmp_path / "go").write_text("")
    assert wait_for(lambda: client.post("/identity", json=5).status_code == 200, 10)
    assert client.post("/identity", json=5).json == 10
    assert client.get("/readyz").status_code == 200
    assert broker.conn.zcard(f"streamer:{broker.prefix}:loading") == 0, "a loaded worker leaves the loading set"
    assert worker.alive()


def test_the_load_so_far_a_web_process_tells_grows_between_its_looks_at_redis(
    broker: Broker, start_worker: Callable[..., ThreadWorker], tmp_path: Any
) -> None:
    """The roster reads the workers' loads once a second (later on a busy
    machine): a refusal between two reads tells the load as read plus the
    time since, not the load as it was when read."""
    from streamer_core.backends.redis.roster import Roster
    from streamer_core.backends.redis.wire import Keys
    from tests.redis.models import GatedLoadModel

    start_worker(broker, GatedLoadModel, model_init_kwargs={"folder": str(tmp_path)})
    assert wait_for(lambda: broker.conn.zcard(f"streamer:{broker.prefix}:loading") == 1, 10), "never said it loads"
    roster = Roster(Keys(broker.prefix), require_workers=True)
    assert roster.check(broker.conn) == 0
    read_at = time.monotonic()
    time.sleep(1.5)  # no look at Redis meanwhile
    error = roster.error()
    assert error.retry_after_s is not None and error.retry_after_s >= time.monotonic() - read_at - 0.05, str(error)
    (tmp_path / "go").write_text("")


def test_with_several_workers_loading_the_longest_load_is_the_one_told(
    broker: Broker, start_worker: Callable[..., ThreadWorker], tmp_path: Any
) -> None:
    """Workers loading at once are listed the longest-loading first: the
    refusal's "for Xs so far", its Retry-After and the status command's
    "the longest for" are the first worker's load, not the newcomer's."""
    from tests.redis.models import GatedLoadModel

    first, second = tmp_path / "first", tmp_path / "second"
    first.mkdir()
    second.mkdir()
    app = redis_app(broker)
    client, runner = app.test_client(), app.test_cli_runner()
    loading_key = f"streamer:{broker.prefix}:loading"
    try:
        start_worker(broker, GatedLoadModel, model_init_kwargs={"folder": str(first)})
        assert wait_for(lambda: broker.conn.zcard(loading_key) == 1, 10), "never said it loads"
        time.sleep(2.2)
        start_worker(broker, GatedLoadModel, model_init_kwargs={"folder": str(second)})
        assert wait_for(lambda: broker.conn.zcard(loading_key) == 2, 10), "the second never said it loads"
        response = client.post("/identity", json=5)
        message = response.json["error"]["message"]
        assert "is loading on 2 worker(s)" in message, message
        seconds = float(message.split(", for ")[1].split("s so far")[0])
        assert seconds >= 2.0, f"told the newest load, not the longest: {message}"
        assert int(response.headers["Retry-After"]) >= 3, "the Retry-After is the longest load so far"
        status = runner.invoke(args=["streamer", "status"])
        longest = float(status.output.split("the longest for ")[1].split("s")[0])
        assert longest >= 2.0, status.output
    finally:
        (first / "go").write_text("")
        (second / "go").write_text("")


def test_a_worker_keeps_what_loading_made_out_of_the_collectors_sight(
    broker: Broker, procs: Processes, make_streamer: Callable[..., Any]
) -> None:
    """gc.freeze() once the model is loaded, as in a process-backend worker."""
    cli = procs.cli(broker, "tests.core.models:frozen_objects")
    assert wait_for(lambda: len(worker_children(cli.pid)) == 1, 30)
    wait_serving(procs, cli, worker_children(cli.pid))
    [frozen] = make_streamer(broker).predict([0])
    assert frozen > 0


def test_the_documented_readiness_answer_is_the_examples(broker: Broker) -> None:
    """The operations page's readiness answer is what the Flask example says
    on the Redis backend before its workers start, key names and advice as written."""
    import re
    from pathlib import Path

    from example_flask import create_app

    page = (Path(__file__).resolve().parents[2] / "docs" / "operations.md").read_text()
    section = page.split("## Liveness and readiness", 1)[1]
    match = re.search(r"```json\n(.*?)```", section, re.S)
    assert match, "the docs' readiness section has no JSON answer"
    documented = json.loads(match.group(1))
    # Its own database: the keys' names do not say which, the workers of
    # other tests are not seen.
    app = create_app({"STREAMER_BACKEND": "redis", "STREAMER_REDIS_URL": broker.url.rsplit("/", 1)[0] + "/14"})
    client = app.test_client()
    answer = wait_for(lambda: (r := client.get("/readyz")).status_code == 503 and "starting" not in r.text and r, 10)
    assert answer, "the example's readiness never said why it is not ready"
    assert answer.json == documented


def test_status_shows_the_redis_address_without_its_password(broker: Broker) -> None:
    from types import SimpleNamespace

    with_password = SimpleNamespace(url=broker.url.replace("redis://", "redis://:s3cret-pw@"), prefix=broker.prefix)
    runner = redis_app(with_password).test_cli_runner()  # type: ignore[arg-type]
    for args in (["streamer", "status"], ["streamer", "status", "--json"]):
        output = runner.invoke(args=args).output
        assert "s3cret" not in output and "redis://***@" in output, output
