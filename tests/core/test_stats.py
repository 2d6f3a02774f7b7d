"""``streamer.stats()`` and the Prometheus metrics: what is counted, where.

Every streamer here has a name of its own (the numbers of one name are
shared by the process), and the tests compare the numbers with the calls
they made."""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import time
import uuid
import weakref
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable, Dict, List

import pytest
from prometheus_client import CollectorRegistry, generate_latest, multiprocess
from prometheus_client.parser import text_string_to_metric_families

from streamer_core import (
    ItemCostError,
    QueueFullError,
    Streamer,
    StreamerClosedError,
    StreamerTimeoutError,
    ThreadedStreamer,
)
from streamer_core.telemetry.metrics import exposition
from streamer_core.telemetry.stats import OUTCOMES, stats_for

from ..conftest import Gate
from ..helpers import stop_each, wait_for
from . import models

ROOT = Path(__file__).resolve().parents[2]


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def slow_double(batch: List[int]) -> List[int]:
    time.sleep(0.02)
    return [x * 2 for x in batch]


def scrape() -> Dict[str, Dict[tuple, float]]:
    """This process's metrics as ``{sample name: {labels: value}}``."""
    body, _ = exposition()
    samples: Dict[str, Dict[tuple, float]] = {}
    for family in text_string_to_metric_families(body.decode()):
        for sample in family.samples:
            samples.setdefault(sample.name, {})[tuple(sorted(sample.labels.items()))] = sample.value
    return samples


def test_counts_every_call_batch_and_input(closing: Callable[[Any], Any]) -> None:
    name = unique("double")
    streamer = closing(ThreadedStreamer(slow_double, 8, 0.05, name=name))
    with ThreadPoolExecutor(32) as pool:
        results = list(pool.map(lambda x: streamer.predict([x])[0], range(200)))
    assert results == [2 * x for x in range(200)]
    stats = streamer.stats()
    assert stats.model == name == streamer.name
    assert stats.requests == dict.fromkeys(OUTCOMES, 0) | {"ok": 200}
    assert stats.batch_size.sum == 200  # every input in exactly one model call
    assert 200 / 8 <= stats.batches < 200  # batched, never more than batch_size at a time
    assert stats.batch_size.counts[-1] == 0 and sum(stats.batch_size.counts[4:]) == 0  # none over 8
    assert stats.queue_wait_seconds.count == 200
    assert stats.model_seconds.count == stats.batches
    assert stats.model_seconds.sum >= 0.02 * stats.batches * 0.9  # each call slept 20 ms
    assert stats.queue_depth == 0 and stats.workers_live == 1


def test_queue_wait_is_arrival_to_the_start_of_the_model_call(gate: Gate, closing: Callable[[Any], Any]) -> None:
    streamer = closing(ThreadedStreamer(gate, 4, 0.0, name=unique("gate")))
    held = streamer.submit(["hold"])
    assert gate.entered.wait(5)
    waiting = streamer.submit(["a", "b"])  # queued behind the held batch
    wait_for(lambda: streamer.stats().queue_depth == 2, 5)
    time.sleep(0.3)
    gate.release()
    assert held.result(5) == ["ok:hold"] and waiting.result(5) == ["ok:a", "ok:b"]
    stats = streamer.stats()
    assert stats.queue_wait_seconds.count == 3
    # "a" and "b" waited the 0.3 s the model was held; "hold" hardly at all.
    assert stats.queue_wait_seconds.sum >= 2 * 0.3
    assert stats.queue_wait_seconds.counts[-1] == 0  # none past 30 s
    assert stats.queue_depth == 0


def test_outcomes_are_counted_by_kind(closing: Callable[[Any], Any], gate: Gate) -> None:
    name = unique("outcomes")

    def cost(x: Any) -> int:
        if x == "bad":
            raise ValueError("no cost")
        return 1

    def model(batch: List[Any]) -> List[Any]:
        if "slow" in batch:
            time.sleep(0.5)
        if "boom" in batch:
            raise RuntimeError("boom")
        return gate(batch)

    streamer = closing(ThreadedStreamer(model, 4, 0.0, name=name, max_queue=3, item_cost=cost))
    assert streamer.predict(["x"]) == ["ok:x"]  # ok
    with pytest.raises(RuntimeError):
        streamer.predict(["boom"])  # model_error
    with pytest.raises(ItemCostError):
        streamer.predict(["bad"])  # invalid
    with pytest.raises(StreamerTimeoutError):
        streamer.predict(["slow"], timeout=0.1)  # timeout
    held = streamer.submit(["hold"])
    assert gate.entered.wait(5)
    queued = streamer.submit(["q1", "q2"])  # 2 of max_queue 3 queued
    with pytest.raises(QueueFullError):
        streamer.submit(["over", "over"])  # rejected
    streamer.submit(["gone"]).cancel()  # cancelled
    gate.release()
    assert held.result(5) == ["ok:hold"] and queued.result(5) == ["ok:q1", "ok:q2"]
    streamer.close()
    with pytest.raises(StreamerClosedError):
        streamer.predict(["late"])  # unavailable
    assert streamer.stats().requests == {
        "ok": 3,
        "model_error": 1,
        "timeout": 1,
        "rejected": 1,
        "unavailable": 1,
        "invalid": 1,
        "too_large": 0,
        "cancelled": 1,
    }
    assert "gone" not in gate.seen()  # a cancelled call never reaches the model


def test_process_workers_report_through_their_parent(closing: Callable[[Any], Any]) -> None:
    name = unique("proc")
    streamer = closing(Streamer(models.batch_info, 4, 0.02, worker_num=2, name=name))
    assert streamer.wait_ready(60)
    assert streamer.stats().workers_live == 2
    with ThreadPoolExecutor(16) as pool:
        outputs = list(pool.map(lambda x: streamer.predict([x])[0], range(60)))
    stats = streamer.stats()
    assert stats.requests["ok"] == 60
    assert stats.batch_size.sum == 60
    # Each batch's size as the workers saw it, against the histogram.
    assert stats.batches >= 60 / 4 and stats.model_seconds.count == stats.batches
    assert max(size for _, size, _ in outputs) <= 4
    assert stats.queue_wait_seconds.count == 60
    streamer.close()
    assert streamer.stats().workers_live == 0  # counters stay, gauges follow the live streamers
    assert streamer.stats().requests["ok"] == 60


def test_stats_of_one_name_are_shared_and_outlive_a_streamer(closing: Callable[[Any], Any]) -> None:
    name = unique("shared")
    first = ThreadedStreamer(models.double, 4, 0.0, name=name)
    first.predict([1, 2])
    first.close()
    second = closing(ThreadedStreamer(models.double, 4, 0.0, name=name))
    second.predict([3])
    assert second.stats().requests["ok"] == 2  # one call on each
    assert second.stats().batch_size.sum == 3
    assert stats_for(name).snapshot() == second.stats()


def test_default_names_and_a_bad_name() -> None:
    with ThreadedStreamer(models.double, 4) as streamer:
        assert streamer.name == "double"
    with pytest.raises(TypeError, match="name must be a non-empty string"):
        ThreadedStreamer(models.double, 4, name="")


def test_prometheus_scrape_matches_the_calls(closing: Callable[[Any], Any]) -> None:
    name = unique("scraped")
    streamer = closing(ThreadedStreamer(models.fail_on_negative, 8, 0.01, name=name))
    with ThreadPoolExecutor(8) as pool:
        futures = [pool.submit(streamer.predict, [x]) for x in [*range(40), -1, -2]]
    errors = sum(1 for f in futures if f.exception() is not None)
    assert errors == 2
    samples = scrape()
    label = (("model", name),)
    assert samples["streamer_requests_total"][(("model", name), ("outcome", "ok"))] == 40
    assert samples["streamer_requests_total"][(("model", name), ("outcome", "model_error"))] == 2
    assert samples["streamer_batch_size_sum"][label] == streamer.stats().batch_size.sum >= 42
    assert samples["streamer_batch_size_count"][label] == streamer.stats().batches
    assert samples["streamer_queue_wait_seconds_count"][label] == streamer.stats().queue_wait_seconds.count
    assert samples["streamer_model_seconds_count"][label] == streamer.stats().batches
    assert samples["streamer_batch_size_bucket"][(("le", "+Inf"), ("model", name))] == streamer.stats().batches
    assert samples["streamer_queue_depth"][label] == 0
    assert samples["streamer_workers_live"][label] == 1


_CALLS = """
import sys
from streamer_core import ThreadedStreamer
from tests.core.models import double
streamer = ThreadedStreamer(double, 4, 0.0, name=sys.argv[1])
for x in range(int(sys.argv[2])):
    assert streamer.predict([x]) == [2 * x]
streamer.close()
"""


def test_multiprocess_mode_adds_up_the_processes(tmp_path: Path) -> None:
    """As under gunicorn with several workers: each process writes its numbers
    under PROMETHEUS_MULTIPROC_DIR, and a scrape adds them up."""
    folder = tmp_path / "prom"
    folder.mkdir()
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(folder), "PYTHONPATH": str(ROOT)}
    name = unique("multi")
    runs = [subprocess.Popen([sys.executable, "-c", _CALLS, name, str(n)], env=env, cwd=ROOT) for n in (7, 11)]
    try:
        assert [run.wait(60) for run in runs] == [0, 0]
    finally:
        stop_each(runs)  # one that hangs is not left running
    registry = CollectorRegistry()
    multiprocess.MultiProcessCollector(registry, path=str(folder))  # type: ignore[no-untyped-call]
    ok = registry.get_sample_value("streamer_requests_total", {"model": name, "outcome": "ok"})
    inputs = registry.get_sample_value("streamer_batch_size_sum", {"model": name})
    waits = registry.get_sample_value("streamer_queue_wait_seconds_count", {"model": name})
    assert (ok, inputs, waits) == (18, 18, 18)


def test_stats_keep_no_streamer_alive() -> None:
    name = unique("gone")
    streamer = ThreadedStreamer(models.double, 4, name=name)
    streamer.predict([1])
    engine = weakref.ref(streamer._engine)
    streamer.close()
    del streamer
    gc.collect()
    assert engine() is None, "the stats hold the streamer's engine (and its model) alive"
    assert stats_for(name).snapshot().requests["ok"] == 1


def _splits_at_three(batch: List[int]) -> List[int]:
    """Runs out of (fake) memory on more than two inputs."""
    if len(batch) > 2:
        raise models.FakeOutOfMemory(f"{len(batch)} inputs do not fit")
    return [x * 2 for x in batch]


def test_out_of_memory_splits_and_the_learned_cap_are_counted_and_scraped(closing: Callable[[Any], Any]) -> None:
    """A batch of 8 that runs out of memory on more than 2 inputs is split
    3 times (8 -> 4 + 4 -> four 2s), and the cap learned is 2 inputs; both
    show in stats() and in a scrape. Before that there is no cap (+Inf)."""
    name = unique("oom")
    streamer = closing(
        ThreadedStreamer(
            _splits_at_three, batch_size=8, isolate_errors=False, oom_errors=(models.FakeOutOfMemory,), name=name
        )
    )
    assert streamer.stats().oom_splits == 0 and streamer.stats().batch_cost_cap == float("inf")
    assert scrape()["streamer_batch_cost_cap"][(("model", name),)] == float("inf")
    assert streamer.predict(list(range(8))) == [2 * x for x in range(8)]  # one call: one batch of 8
    stats = streamer.stats()
    assert (stats.oom_splits, stats.batch_cost_cap) == (3, 2)
    samples = scrape()
    assert samples["streamer_oom_splits_total"][(("model", name),)] == 3
    assert samples["streamer_batch_cost_cap"][(("model", name),)] == 2


_OOM_CALLS = """
import sys
from streamer_core import ThreadedStreamer
from tests.core import models
from tests.core.test_stats import _splits_at_three

streamer = ThreadedStreamer(
    _splits_at_three, batch_size=8, isolate_errors=False, oom_errors=(models.FakeOutOfMemory,), name=sys.argv[1]
)
assert streamer.predict(list(range(8))) == [2 * x for x in range(8)]
assert streamer.stats().batch_cost_cap == 2
streamer.close()
"""


def test_multiprocess_mode_adds_up_out_of_memory_splits(tmp_path: Path) -> None:
    folder = tmp_path / "prom"
    folder.mkdir()
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(folder), "PYTHONPATH": str(ROOT)}
    name = unique("multi-oom")
    runs = [subprocess.Popen([sys.executable, "-c", _OOM_CALLS, name], env=env, cwd=ROOT) for _ in range(2)]
    try:
        assert [run.wait(60) for run in runs] == [0, 0]
    finally:
        stop_each(runs)  # one that hangs is not left running
    registry = CollectorRegistry()
    multiprocess.MultiProcessCollector(registry, path=str(folder))  # type: ignore[no-untyped-call]
    assert registry.get_sample_value("streamer_oom_splits_total", {"model": name}) == 6


_REDIS_COUNTS = """
import sys
from streamer_core.telemetry.stats import stats_for
stats = stats_for(sys.argv[1])
stats.redelivered(2)
stats.dead_lettered()
stats.dropped("disconnected", 3)
"""


def test_multiprocess_mode_adds_up_redelivered_dead_lettered_and_dropped(tmp_path: Path) -> None:
    """As the Redis worker supervisor's workers count them, each in its process."""
    folder = tmp_path / "prom"
    folder.mkdir()
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(folder), "PYTHONPATH": str(ROOT)}
    name = unique("multi-redis")
    runs = [subprocess.Popen([sys.executable, "-c", _REDIS_COUNTS, name], env=env, cwd=ROOT) for _ in range(2)]
    try:
        assert [run.wait(60) for run in runs] == [0, 0]
    finally:
        stop_each(runs)  # one that hangs is not left running
    registry = CollectorRegistry()
    multiprocess.MultiProcessCollector(registry, path=str(folder))  # type: ignore[no-untyped-call]
    assert registry.get_sample_value("streamer_redis_redelivered_total", {"model": name}) == 4
    assert registry.get_sample_value("streamer_redis_dead_lettered_total", {"model": name}) == 2
    assert registry.get_sample_value("streamer_dropped_total", {"model": name, "reason": "disconnected"}) == 6
    assert registry.get_sample_value("streamer_dropped_total", {"model": name, "reason": "expired"}) == 0
    assert registry.get_sample_value("streamer_requests_total", {"model": name, "outcome": "ok"}) == 0


def test_redelivered_and_dead_lettered_are_scraped_each_under_its_own_name() -> None:
    name = unique("redis-apart")
    stats = stats_for(name)
    stats.redelivered(2)
    stats.dead_lettered()
    found = scrape()
    assert found["streamer_redis_redelivered_total"][(("model", name),)] == 2
    assert found["streamer_redis_dead_lettered_total"][(("model", name),)] == 1


def test_a_batchs_last_look_counts_what_it_drops_by_why_the_call_ended() -> None:
    """The backends' look at a formed batch before the model runs it
    (``live_items``): each input of a call that ended since is dropped and
    counted by why, not all as cancelled."""
    from streamer_core.batching.calls import Item, Task, live_items
    from streamer_core.errors import StreamerTimeoutError
    from streamer_core.future import BatchFuture

    name = unique("last-look")
    stats = stats_for(name)
    futures = [BatchFuture() for _ in range(4)]
    futures[1].cancel()
    futures[2].disconnected()
    futures[3].set_exception(StreamerTimeoutError("past its deadline"))
    items = [Item(Task(future, 1, 10.0), 0, x, 0.0) for x, future in enumerate(futures)]
    assert [item.value for item in live_items(items, stats)] == [0]
    assert stats.snapshot().dropped == {"cancelled": 1, "disconnected": 1, "expired": 1}


def test_live_workers_are_counted_by_device(closing: Callable[[Any], Any]) -> None:
    """Each process worker on the device it was given (CUDA_VISIBLE_DEVICES:
    no GPU is needed for that), the thread backend's one on ``default``,
    scraped as ``streamer_workers_live_by_device``; none once closed."""
    name = unique("devices")
    streamer = closing(Streamer(models.double, 4, 0.01, worker_num=3, cuda_devices=[0, 1], name=name))
    assert streamer.wait_ready(60)
    assert wait_for(lambda: streamer.stats().workers_by_device == {"0": 2, "1": 1}, 30), streamer.stats()
    by_device = scrape()["streamer_workers_live_by_device"]
    assert by_device[(("device", "0"), ("model", name))] == 2
    assert by_device[(("device", "1"), ("model", name))] == 1
    streamer.close()
    assert streamer.stats().workers_by_device == {}
    threaded = unique("devices-thread")
    closing(ThreadedStreamer(models.double, 4, 0.01, name=threaded))
    assert stats_for(threaded).snapshot().workers_by_device == {"default": 1}
    assert scrape()["streamer_workers_live_by_device"][(("device", "default"), ("model", threaded))] == 1


_QUEUED = """
import sys, threading, time
from streamer_core import ThreadedStreamer

release = threading.Event()

def held(batch):
    release.wait(60)
    return batch

name, waiting = sys.argv[1], int(sys.argv[2])
streamer = ThreadedStreamer(held, batch_size=1, max_latency=0.001, name=name)
first = streamer.submit([0])  # in the model, held there
calls = [streamer.submit([x]) for x in range(waiting)]  # these wait (one may be handed on ahead)
time.sleep(0.5)
depth = streamer.stats().queue_depth
time.sleep(1.5)  # the gauges are written to the files once a second (GAUGE_PERIOD_S)
assert streamer.stats().queue_depth == depth
print(depth, flush=True)
sys.stdin.readline()
release.set()
streamer.close()
"""


def test_multiprocess_queue_depth_is_the_sum_of_the_live_processes(tmp_path: Path) -> None:
    """Two web processes, one with a few inputs waiting and one with more:
    the scrape says how many wait in all (each process has a queue of its
    own), not the deepest queue's count."""
    folder = tmp_path / "prom"
    folder.mkdir()
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(folder), "PYTHONPATH": str(ROOT)}
    name = f"depth-{uuid.uuid4().hex[:8]}"
    runs = [
        subprocess.Popen([sys.executable, "-c", _QUEUED, name, str(n)], env=env, cwd=ROOT,
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        for n in (3, 5)
    ]  # fmt: skip
    try:
        depths = [int(run.stdout.readline()) for run in runs]
        assert 0 < depths[0] < depths[1], depths  # each process has inputs waiting in its own queue
        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry, path=str(folder))  # type: ignore[no-untyped-call]
        text = generate_latest(registry).decode()
        depth = {
            sample.labels["model"]: sample.value
            for family in text_string_to_metric_families(text)
            if family.name == "streamer_queue_depth"
            for sample in family.samples
        }
        assert depth.get(name) == sum(depths), (depths, text)
    finally:
        try:
            for run in runs:
                run.communicate("\n", timeout=30)  # let it go; closes its pipes
        finally:
            stop_each(runs)  # one that hangs is not left running
    assert [run.returncode for run in runs] == [0, 0]
