"""A real CUDA out-of-memory error: a model that takes a fortieth of the
card for each input runs out on a batch of 64, the batch is split and its
halves retried, later batches are capped at what fit, and every caller gets
its own right answer. And a worker whose GPU another process holds fails to
start with a message that says so."""

from __future__ import annotations

import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from typing import Iterator

import pytest

from streamer_core import Streamer
from streamer_core.errors import WorkerStartError
from tests.gpu.models import Greedy, NeedsMemory

GIB = 1 << 30


def total_memory() -> int:
    import torch

    return int(torch.cuda.get_device_properties(0).total_memory)


def test_a_batch_too_large_for_the_card_is_split_and_every_answer_is_right() -> None:
    per_item = total_memory() // 40  # 64 inputs: 1.6 cards; 16: 0.4 of one
    streamer = Streamer(
        Greedy, batch_size=64, max_latency=0.05, worker_num=1, cuda_devices=[0],
        model_init_kwargs={"bytes_per_item": per_item},
    )  # fmt: skip
    try:
        assert streamer.wait_ready(180)
        with ThreadPoolExecutor(128) as pool:
            answers = list(pool.map(lambda i: streamer.predict([i], timeout=120), range(128)))
        stats = streamer.stats()
    finally:
        streamer.close()
    assert answers == [[2 * i] for i in range(128)]
    assert stats.oom_splits >= 1, "no batch ran out of memory: the card is larger than the test assumes"
    assert stats.batch_cost_cap < 40, f"the cap learned ({stats.batch_cost_cap}) lets a batch take the whole card"


@pytest.fixture
def gpu_held() -> Iterator[None]:
    """Another process holding all of device 0's free memory but 1 GiB
    (room for a CUDA context, not for a model)."""
    script = (
        "import sys, time, torch\n"
        "free, total = torch.cuda.mem_get_info(0)\n"
        f"held = torch.empty(max(0, free - {GIB}), dtype=torch.uint8, device='cuda:0')\n"
        "print('held', flush=True)\n"
        "sys.stdin.read()\n"
    )
    holder = subprocess.Popen([sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        yield
    finally:
        holder.kill()
        holder.wait(30)


def test_a_worker_whose_gpu_another_process_holds_says_so(gpu_held: None) -> None:
    streamer = Streamer(
        NeedsMemory, batch_size=4, worker_num=1, cuda_devices=[0],
        model_init_kwargs={"bytes_needed": 4 * GIB},
    )  # fmt: skip
    try:
        with pytest.raises(WorkerStartError) as info:
            streamer.wait_ready(180)
    finally:
        streamer.close()
    message = str(info.value)
    assert "ran out of memory on device 0 while it loaded" in message, message
    assert "another process may hold that memory" in message and "nvidia-smi" in message
