"""Wrong settings fail at construction, with a message that says how to fix them."""

from __future__ import annotations

import pytest

from streamer_core import BatchingConfig, Streamer, ThreadedStreamer
from streamer_core.options.config import MAX_SECONDS
from tests.core import models


@pytest.mark.parametrize(
    "kwargs, error, message",
    [
        ({"batch_size": 0}, ValueError, "batch_size must be a whole number >= 1, got 0"),
        ({"batch_size": 2.5}, TypeError, "batch_size must be a whole number >= 1, got 2.5"),
        ({"batch_size": True}, TypeError, "batch_size must be a whole number >= 1, got True"),
        ({"batch_size": 4, "max_latency": -1}, ValueError, "max_latency is in seconds"),
        ({"batch_size": 4, "max_latency": "0.1"}, TypeError, "max_latency is in seconds"),
        ({"batch_size": 4, "timeout": 0}, ValueError, "timeout is in seconds and must be a finite number > 0"),
        # Beyond a day a wait is a hang; far beyond, the dispatcher's timed wait overflowed and it died.
        ({"batch_size": 4, "timeout": 86_400.5}, ValueError, r"timeout .* at most 86400 \(a day\); got 86400.5"),
        ({"batch_size": 4, "timeout": 1e12}, ValueError, r"timeout .* at most 86400 \(a day\); got 1000000000000.0"),
        ({"batch_size": 4, "max_latency": 1e12}, ValueError, r"max_latency .* at most 86400 \(a day\)"),
        (
            {"batch_size": 4, "max_queue": 0},
            ValueError,
            "max_queue must be a whole number >= 1, or None for no limit; got 0",
        ),
        ({"batch_size": 4, "isolate_errors": "yes"}, TypeError, "isolate_errors must be True or False"),
    ],
)
def test_bad_batching_settings(kwargs, error, message):
    with pytest.raises(error, match=message):
        BatchingConfig(**kwargs)
    with pytest.raises(error, match=message):
        ThreadedStreamer(models.double, **kwargs)


def test_max_latency_zero_is_allowed():
    assert BatchingConfig(4, max_latency=0).max_latency == 0.0


def test_a_day_is_the_longest_timeout_and_a_longer_wait_for_a_result_ends_with_the_call():
    with ThreadedStreamer(models.double, 4, timeout=MAX_SECONDS) as streamer:
        assert streamer.predict([1]) == [2]
        with pytest.raises(ValueError, match="at most 86400"):
            streamer.predict([1], timeout=MAX_SECONDS * 2)
        # A caller's own wait may be longer than any call takes: it ends
        # with the call (it used to overflow the lock's timed wait).
        assert streamer.submit([3]).result(timeout=1e15) == [6]


@pytest.mark.parametrize(
    "kwargs, error, message",
    [
        ({"worker_num": 0}, ValueError, "worker_num must be a whole number >= 1, got 0"),
        ({"cuda_devices": []}, ValueError, "must name at least one device"),
        ({"cuda_devices": {"gpu": 0}}, TypeError, r"must be a device index such as 0, a list of them such as \[0, 1\]"),
        ({"cuda_devices": "0,-1"}, ValueError, "cuda_devices holds -1: device indexes start at 0"),
        ({"cuda_devices": [0, -1]}, ValueError, "device indexes start at 0"),
        ({"cuda_devices": [0, 1.5]}, TypeError, "each device must be an int index"),
        ({"max_item_crashes": 0}, ValueError, "max_item_crashes must be a whole number >= 1, got 0"),
    ],
)
def test_bad_process_settings(kwargs, error, message):
    with pytest.raises(error, match=message):
        Streamer(models.double, 4, **kwargs)


def test_devices_written_as_text_are_read_as_every_layer_reads_them(closing):
    """``"0,1"``, as an environment variable or ``--devices`` gives devices,
    is devices 0 and 1 here too: one rule wherever devices are given."""
    streamer = closing(Streamer(models.double, 4, cuda_devices="0,1", worker_num=1))
    assert streamer.cuda_devices == [0, 1]


def test_non_callable_model_is_refused():
    with pytest.raises(TypeError, match="predict_function must be callable"):
        ThreadedStreamer("model", 4)


def test_a_managed_model_class_is_refused_by_the_thread_backend():
    with pytest.raises(TypeError, match="use Streamer to build it in worker processes"):
        ThreadedStreamer(models.EnvModel, 4)


@pytest.mark.parametrize("batch", ["hello", b"hello"])
def test_a_string_is_not_taken_for_a_batch(closing, batch):
    streamer = closing(ThreadedStreamer(models.double, 4))
    with pytest.raises(TypeError, match=r"wrap a single input in a list: predict\(\[x\]\)\[0\]"):
        streamer.predict(batch)
