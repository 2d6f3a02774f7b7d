"""Workers placed by ``cuda_devices`` / ``--devices``: each worker computes
on the device it was given (its ``CUDA_VISIBLE_DEVICES``, its current device,
its model's parameters), and two workers may share one device."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Dict, List

import pytest

from streamer_core import Streamer
from streamer_core.errors import StreamerError
from tests.gpu.conftest import Broker, Processes
from tests.gpu.models import WhereAmI, device_facts


def uuids() -> List[str]:
    """Each CUDA device's UUID, as this process sees them."""
    import torch

    return [
        str(getattr(torch.cuda.get_device_properties(i), "uuid", torch.cuda.get_device_properties(i).name))
        for i in range(torch.cuda.device_count())
    ]


def device_count() -> int:
    try:
        import torch
    except ImportError:
        return 0
    return int(torch.cuda.device_count())


def facts_of_every_worker(predict: Callable[[int], Any], workers: int, seconds: float = 120.0) -> Dict[int, Any]:
    """Each worker's answer, by pid: calls in parallel until ``workers``
    pids have answered (errors while workers start are retried)."""
    seen: Dict[int, Any] = {}
    deadline = time.monotonic() + seconds
    with ThreadPoolExecutor(8) as pool:
        while len(seen) < workers and time.monotonic() < deadline:
            for answer in pool.map(lambda i: _try(predict, i), range(32)):
                if answer is not None:
                    seen[answer["pid"]] = answer
    assert len(seen) == workers, f"{len(seen)} of {workers} workers answered in {seconds:.0f} s: {seen}"
    return seen


def _try(predict: Callable[[int], Any], i: int) -> Any:
    try:
        return predict(i)
    except StreamerError:
        time.sleep(0.5)
        return None


def process_workers_on(devices: List[int]) -> Dict[int, Any]:
    """Where each of ``len(devices)`` process-backend workers, placed by
    ``cuda_devices=devices``, computes, by pid."""
    streamer = Streamer(WhereAmI, batch_size=1, max_latency=0.001, worker_num=len(devices), cuda_devices=devices)
    try:
        assert streamer.wait_ready(180)
        return facts_of_every_worker(lambda i: streamer.predict([i], timeout=60)[0], len(devices))
    finally:
        streamer.close()


def test_two_process_workers_share_device_0() -> None:
    """The one-GPU box: ``cuda_devices=[0, 0]``, two workers on device 0."""
    workers = process_workers_on([0, 0])
    for facts in workers.values():
        assert facts["visible"] == "0" and facts["current"] == 0, facts
        assert facts["parameters"] == ["cuda:0"], facts
        assert facts["uuid"] == uuids()[0], "the worker computed on another device than device 0"


@pytest.mark.skipif("device_count() < 2", reason="needs two CUDA devices")
def test_each_process_worker_computes_on_the_device_it_was_given() -> None:
    workers = process_workers_on([0, 1])
    by_device = {facts["visible"]: facts for facts in workers.values()}
    assert set(by_device) == {"0", "1"}, workers
    for index, facts in by_device.items():
        assert facts["current"] == 0 and facts["parameters"] == ["cuda:0"], facts  # device 0 of what it sees
        assert facts["uuid"] == uuids()[int(index)], f"worker on device {index} computed elsewhere"


def test_redis_workers_take_the_devices_of_the_worker_command(
    broker: Broker, procs: Processes, make_streamer: Callable[..., Any]
) -> None:
    """``streamer-worker --devices``: worker i on ``devices[i % n]``."""
    devices = "0,1" if device_count() >= 2 else "0"
    procs.cli(broker, "tests.gpu.models:WhereAmI", "--workers", "2", "--devices", devices, "--batch-size", "1")
    streamer = make_streamer(broker)
    workers = facts_of_every_worker(lambda i: streamer.predict([i], timeout=30)[0], 2, seconds=180)
    expected = ["0", "1"] if devices == "0,1" else ["0", "0"]
    assert sorted(facts["visible"] for facts in workers.values()) == expected, workers
    for facts in workers.values():
        assert facts["parameters"] == ["cuda:0"], facts
        assert facts["uuid"] == uuids()[int(facts["visible"])], facts


def test_this_process_sees_cuda() -> None:
    """What the placement tests compare against: CUDA works in the tests' own process."""
    facts = device_facts()
    assert facts["current"] == 0 and facts["uuid"] == uuids()[0]
