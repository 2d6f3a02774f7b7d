"""An operator sees each model become ready: one INFO line on the
``streamer_core`` logger per thread backend and per worker, naming the
model, its device (``cpu`` when none was given, never ``None``), how long it
took to load, and how it is batched."""

from __future__ import annotations

import logging
import re

from streamer_core import Streamer, ThreadedStreamer
from tests.core import models


def ready_lines(caplog) -> list:
    return [r.getMessage() for r in caplog.records if r.name == "streamer_core" and " ready on " in r.getMessage()]


def test_the_thread_backend_says_its_model_is_ready(closing, caplog):
    with caplog.at_level(logging.INFO, logger="streamer_core"):
        closing(ThreadedStreamer(models.double, 8, 0.01))
    [line] = ready_lines(caplog)
    assert line == "thread backend: model double ready on cpu in 0.0 s (batch size 8, max latency 0.01 s)"
    assert all(r.levelno == logging.INFO for r in caplog.records if r.getMessage() == line)


def test_a_worker_says_what_it_loaded_on_which_device_and_how_long_it_took(closing, caplog):
    with caplog.at_level(logging.INFO, logger="streamer_core"):
        streamer = closing(Streamer(models.SlowLoadingModel, 4, 0.02, model_init_kwargs={"seconds": 0.3}))
        assert streamer.wait_ready(30)
    [line] = ready_lines(caplog)
    expected = r"SlowLoadingModel worker 0 \(pid \d+\): model SlowLoadingModel ready on cuda:7 in (\d+\.\d) s"
    match = re.fullmatch(expected + r" \(batch size 4, max latency 0.02 s\)", line)
    assert match, line
    assert float(match.group(1)) >= 0.3


def test_a_worker_given_a_gpu_names_it_and_one_given_none_says_cpu(closing, caplog):
    with caplog.at_level(logging.INFO, logger="streamer_core"):
        streamer = closing(Streamer(models.EnvModel, 4, 0.02, worker_num=2, cuda_devices=[1]))
        assert streamer.wait_ready(30)
        assert closing(Streamer(models.EnvModel, 4, 0.02)).wait_ready(30)
    devices = sorted(line.split(" ready on ")[1].split(" in ")[0] for line in ready_lines(caplog))
    assert devices == ["GPU 1", "GPU 1", "cpu"]
