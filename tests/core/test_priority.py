"""Priority levels on the thread and process backends: a batch takes the
highest level (1) first and fills from lower ones; aging serves a waiting
low input as a higher one; each level has its own queue bound and default
timeout; a priority that is not a level is refused. (The rule itself is
:mod:`streamer_core.batching.levels`.)"""

from __future__ import annotations

import threading
import time
import uuid
from pathlib import Path
from typing import Any, Callable, Dict, List, Tuple

import pytest

from streamer_core import QueueFullError, Streamer, StreamerTimeoutError, ThreadedStreamer
from streamer_core.future import BatchFuture
from streamer_core.options.config import BatchingConfig
from streamer_core.streamer import BaseStreamer
from tests.core import models
from tests.helpers import ROOT, metric_samples, stop_each, wait_for


class Busy:
    """A streamer of one backend whose model a test holds busy, with one
    more batch sent ahead to it, so that what is submitted now waits in
    its queue until :meth:`release`; and what reached its model."""

    def __init__(
        self, streamer: BaseStreamer, batches: Callable[[], List[List[Any]]], release: Callable[[], None], ahead: bool
    ):
        self.streamer = streamer
        self.batches = batches
        self.release = release
        self.first = "a0" if ahead else "hold"
        self.ahead = streamer.submit(["a0", "a1", "a2", "a3"], priority=1) if ahead else None  # a full batch
        assert wait_for(lambda: streamer.queued() == 0, 10), "the batch was not sent ahead"

    def after_ahead(self) -> List[List[Any]]:
        """The batches run after the one sent ahead (without one: the held one)."""
        batches = self.batches()
        firsts = [index for index, batch in enumerate(batches) if self.first in batch]
        return batches[firsts[0] + 1 :] if firsts else []


@pytest.fixture(params=["thread", "process"])
def make_busy(request: Any, closing: Callable[[Any], Any], gate: Any, tmp_path: Path) -> Callable[..., Busy]:
    def make(ahead: bool = True, **options: Any) -> Busy:
        name = f"priority-{uuid.uuid4().hex[:8]}"
        if request.param == "thread":
            streamer = closing(ThreadedStreamer(gate, batch_size=4, max_latency=0.01, name=name, **options))
            streamer.submit(["hold"], priority=1)
            assert gate.entered.wait(5)
            return Busy(streamer, lambda: gate.batches, gate.release, ahead)
        (tmp_path / "hold").write_text("")
        folder = {"folder": str(tmp_path)}
        streamer = closing(Streamer(models.RecordingGate, 4, 0.01, model_init_kwargs=folder, name=name, **options))
        assert streamer.wait_ready(60)
        streamer.submit(["hold"], priority=1)
        assert wait_for(lambda: (tmp_path / "inside").exists(), 10), "the held batch never reached the model"
        return Busy(streamer, lambda: models.ran_batches(tmp_path), lambda: (tmp_path / "hold").unlink(), ahead)

    return make


def _answered(futures: List[BatchFuture]) -> None:
    for future in futures:
        future.result(20)


def test_a_batch_takes_the_highest_level_first_then_fills_from_lower_ones(make_busy: Callable[..., Busy]) -> None:
    busy = make_busy(priority_levels=3, timeout=30)
    streamer = busy.streamer
    futures = [streamer.submit([f"low{i}"], priority=3) for i in range(3)]
    futures += [streamer.submit([f"mid{i}"], priority=2) for i in range(2)]
    futures += [streamer.submit([f"high{i}"]) for i in range(2)]  # no priority: the lowest, 3
    futures += [streamer.submit(["top"], priority=1)]
    busy.release()
    _answered(futures + [busy.ahead])
    first, second = busy.after_ahead()[:2]
    assert first == ["top", "mid0", "mid1", "low0"], "the highest level first, each level oldest first"
    assert second == ["low1", "low2", "high0", "high1"]


def test_a_busy_worker_is_handed_no_lower_level_batch_ahead_so_a_high_input_runs_next(
    make_busy: Callable[..., Busy],
) -> None:
    busy = make_busy(ahead=False, priority_levels=2, timeout=30)
    streamer = busy.streamer
    futures = [streamer.submit([f"low{i}"], priority=2) for i in range(4)]  # a full batch, of level 2
    time.sleep(0.2)
    assert streamer.queued() == 4, "kept in the queue, not handed to the busy worker"
    futures.append(streamer.submit(["high"], priority=1))
    busy.release()
    _answered(futures)
    assert busy.after_ahead()[0] == ["high", "low0", "low1", "low2"], "the high input runs in the next batch"


def test_aging_serves_a_waiting_low_input_before_newer_high_ones(make_busy: Callable[..., Busy]) -> None:
    busy = make_busy(priority_levels=2, priority_aging=0.2, timeout=30)
    streamer = busy.streamer
    futures = [streamer.submit(["old-low"], priority=2)]
    time.sleep(0.5)  # past priority_aging: served as priority 1, and older than what comes now
    futures += [streamer.submit([f"high{i}"], priority=1) for i in range(4)]
    futures += [streamer.submit(["new-low"], priority=2)]
    busy.release()
    _answered(futures + [busy.ahead])
    first = busy.after_ahead()[0]
    assert first == ["old-low", "high0", "high1", "high2"], "the aged input goes first, the new low one waits"


def test_a_full_level_refuses_only_its_own_calls(make_busy: Callable[..., Busy]) -> None:
    busy = make_busy(priority_levels=2, max_queue=4, priority_max_queue=[None, 2], timeout=30)
    streamer = busy.streamer
    futures = [streamer.submit(["low0", "low1"], priority=2)]
    with pytest.raises(QueueFullError, match="priority 2"):
        streamer.submit(["low2"], priority=2)
    futures += [
        streamer.submit([f"high{i}"], priority=1) for i in range(6)
    ]  # None: no bound at priority 1, though max_queue is 4
    busy.release()
    _answered(futures + [busy.ahead])
    assert streamer.stats().requests["rejected"] == 1, "the refused call is counted"


def test_max_queue_bounds_each_level(make_busy: Callable[..., Busy]) -> None:
    busy = make_busy(priority_levels=2, max_queue=4, timeout=30)
    streamer = busy.streamer
    futures = [streamer.submit([f"{name}{i}" for i in range(4)], priority=p) for name, p in (("low", 2), ("high", 1))]
    for priority in (1, 2):
        with pytest.raises(QueueFullError, match=f"priority {priority}"):
            streamer.submit(["more"], priority=priority)
    busy.release()
    _answered(futures + [busy.ahead])


def test_each_level_has_its_own_default_timeout(make_busy: Callable[..., Busy]) -> None:
    busy = make_busy(priority_levels=2, priority_timeout=[None, 0.3], timeout=30)
    streamer = busy.streamer
    high = streamer.submit(["high"], priority=1)
    started = time.monotonic()
    with pytest.raises(StreamerTimeoutError):
        streamer.predict(["low"], priority=2)
    assert 0.2 < time.monotonic() - started < 5
    assert not high.done(), "the high call keeps the streamer's timeout"
    busy.release()
    _answered([high, busy.ahead])


def test_a_priority_that_is_not_a_level_is_refused(closing: Callable[[Any], Any]) -> None:
    streamer = closing(ThreadedStreamer(models.double, batch_size=4, priority_levels=2, name="priority-bad"))
    for bad in (0, 3, -1):
        with pytest.raises(ValueError, match="from 1 \\(the highest\\) to 2"):
            streamer.predict([1], priority=bad)
    for bad in ("1", 1.0, True):
        with pytest.raises(TypeError):
            streamer.predict([1], priority=bad)  # type: ignore[arg-type]
    assert streamer.predict([1], priority=2) == [2]
    one_level = closing(ThreadedStreamer(models.double, batch_size=4, name="priority-one"))
    assert one_level.predict([1], priority=1) == [2], "priority 1 is the only level of a streamer without levels"
    with pytest.raises(ValueError):
        one_level.predict([1], priority=2)


@pytest.mark.parametrize(
    "options, message",
    [
        ({"priority_levels": 2, "default_priority": 3}, "default_priority is 3, but priority_levels is 2"),
        ({"priority_levels": 3, "priority_max_queue": [1, 2]}, "priority_max_queue has 2 entries"),
        ({"priority_levels": 2, "priority_timeout": [1.0]}, "priority_timeout has 1 entries"),
        ({"priority_levels": 2, "priority_timeout": [1.0, -1]}, r"priority_timeout \[1\] \(priority 2\)"),
        ({"priority_levels": 0}, "priority_levels must be a whole number >= 1"),
        ({"priority_aging": 0}, "priority_aging is in seconds"),
    ],
)
def test_priority_settings_are_checked_together(options: Any, message: str) -> None:
    with pytest.raises((TypeError, ValueError), match=message):
        BatchingConfig(4, **options)


def test_default_priority_is_the_level_of_a_call_naming_none() -> None:
    config = BatchingConfig(4, priority_levels=3, default_priority=1, priority_timeout=[None, 2.0, 5.0])
    assert config.level_of(None) == 0 and config.level_of(3) == 2
    assert BatchingConfig(4, priority_levels=3).level_of(None) == 2, "unset: the lowest level"
    assert config.call_timeout(None, 0) == config.timeout and config.call_timeout(None, 2) == 5.0
    assert config.call_timeout(1.5, 2) == 1.5, "a call's own timeout wins"


def test_default_priority_may_be_the_lowest_level() -> None:
    assert BatchingConfig(4, priority_levels=3, default_priority=3).level_of(None) == 2
    assert BatchingConfig(4, priority_levels=1, default_priority=1).level_of(None) == 0


def test_web_settings_check_the_priority_options_together() -> None:
    from streamer_core.web.spec import ModelSpec

    def problems(**values: Any) -> List[str]:
        _, found = ModelSpec.from_settings("m", models.double, values, lambda name: f"STREAMER_{name.upper()}")
        return [problem.message for problem in found]

    assert problems(priority_levels=2, priority_max_queue=[None, 10], priority_timeout=[1.0, None]) == []
    assert problems(priority_levels=2, default_priority=3) == [
        "STREAMER_DEFAULT_PRIORITY is 3, but STREAMER_PRIORITY_LEVELS is 2: the levels are 1 (highest) to 2"
    ]
    assert problems(priority_levels=2, backend="redis", redis_url="redis://127.0.0.1:6379/0") == [], "every backend"


def test_each_level_counts_its_outcomes_its_queue_waits_and_its_depth(make_busy: Callable[..., Busy]) -> None:
    busy = make_busy(priority_levels=2, priority_max_queue=[None, 1], timeout=30)
    streamer = busy.streamer
    futures = [streamer.submit(["low"], priority=2)]
    with pytest.raises(QueueFullError):
        streamer.submit(["refused"], priority=2)
    futures += [streamer.submit([f"high{i}"], priority=1) for i in range(2)]
    assert [level.queue_depth for level in streamer.stats().priorities] == [2, 1]
    busy.release()
    _answered(futures + [busy.ahead])
    assert wait_for(lambda: streamer.stats().requests["ok"] == 5, 5)  # the held call, the one ahead, these three
    high, low = streamer.stats().priorities
    assert (high.priority, low.priority) == (1, 2)
    assert high.requests["ok"] == 4 and high.requests["rejected"] == 0
    assert low.requests["ok"] == 1 and low.requests["rejected"] == 1
    assert high.queue_wait_seconds.count == 7 and low.queue_wait_seconds.count == 1, "per input: hold, 4 ahead, 2"
    assert low.queue_wait_seconds.sum > 0 and high.queue_depth == low.queue_depth == 0


def test_prometheus_has_a_priority_label_only_for_a_model_with_levels(closing: Callable[[Any], Any]) -> None:
    from prometheus_client.parser import text_string_to_metric_families

    from streamer_core.telemetry.metrics import exposition

    leveled, flat = (f"priority-metrics-{uuid.uuid4().hex[:8]}" for _ in range(2))
    two = closing(ThreadedStreamer(models.double, batch_size=4, priority_levels=2, name=leveled))
    one = closing(ThreadedStreamer(models.double, batch_size=4, name=flat))
    assert two.predict([1], priority=1) == [2] and two.predict([2]) == [4] and one.predict([3]) == [6]
    samples = {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(exposition()[0].decode())
        for sample in family.samples
    }
    for priority in ("1", "2"):
        level = (("model", leveled), ("priority", priority))
        assert samples[("streamer_priority_requests_total", (*level[:1], ("outcome", "ok"), level[1]))] == 1
        assert samples[("streamer_priority_queue_wait_seconds_count", level)] == 1
        assert samples[("streamer_priority_queue_depth", level)] == 0
    assert samples[("streamer_requests_total", (("model", leveled), ("outcome", "ok")))] == 2, "the model's as before"
    assert not [key for key in samples if ("model", flat) in key[1] and any(k == "priority" for k, _ in key[1])]
    assert samples[("streamer_requests_total", (("model", flat), ("outcome", "ok")))] == 1


_LEVELED_CALLS = """
import sys
from streamer_core import ThreadedStreamer
from tests.core.models import double
streamer = ThreadedStreamer(double, 4, 0.0, name=sys.argv[1], priority_levels=2)
for x in range(int(sys.argv[2])):
    assert streamer.predict([x], priority=1 + x % 2) == [2 * x]
streamer.close()
"""


def test_multiprocess_mode_adds_up_each_levels_numbers(tmp_path: Path) -> None:
    import os
    import subprocess
    import sys

    from prometheus_client import CollectorRegistry, multiprocess

    folder = tmp_path / "prom"
    folder.mkdir()
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(folder), "PYTHONPATH": str(root)}
    name = f"priority-multi-{uuid.uuid4().hex[:8]}"
    runs = [subprocess.Popen([sys.executable, "-c", _LEVELED_CALLS, name, str(n)], env=env, cwd=root) for n in (5, 8)]
    try:
        assert [run.wait(60) for run in runs] == [0, 0]
    finally:
        stop_each(runs)  # one that hangs is not left running
    registry = CollectorRegistry()
    multiprocess.MultiProcessCollector(registry, path=str(folder))  # type: ignore[no-untyped-call]

    def value(sample: str, **labels: str) -> Any:
        return registry.get_sample_value(sample, {"model": name, **labels})

    assert value("streamer_priority_requests_total", priority="1", outcome="ok") == 3 + 4  # x even: priority 1
    assert value("streamer_priority_requests_total", priority="2", outcome="ok") == 2 + 4
    assert value("streamer_priority_queue_wait_seconds_count", priority="1") == 7
    assert value("streamer_priority_queue_wait_seconds_count", priority="2") == 6
    assert value("streamer_requests_total", outcome="ok") == 13, "the model's own, once per call"


def _leveled_scrape(tmp_path: Path, multiprocess: bool) -> Dict[Tuple[str, Tuple[Tuple[str, str], ...]], float]:
    """The per-level samples of a two-level model scraped with three inputs
    waiting at level 2 (tests/core/scripts/leveled_metrics.py), in one
    process or under ``PROMETHEUS_MULTIPROC_DIR``, the model's name left out."""
    import os
    import subprocess
    import sys

    env = {key: value for key, value in os.environ.items() if key.lower() != "prometheus_multiproc_dir"}
    if multiprocess:
        folder = tmp_path / "prom"
        folder.mkdir()
        env["PROMETHEUS_MULTIPROC_DIR"] = str(folder)
    name = f"priority-scrape-{uuid.uuid4().hex[:8]}"
    done = subprocess.run(
        [sys.executable, str(Path(__file__).with_name("scripts") / "leveled_metrics.py"), name],
        env={**env, "PYTHONPATH": str(ROOT)}, cwd=ROOT, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return {
        (sample, tuple(label for label in labels if label[0] != "model")): value
        for (sample, labels), value in metric_samples(done.stdout).items()
        if sample.startswith("streamer_priority_") and ("model", name) in labels
    }


def test_multiprocess_mode_labels_each_levels_samples_as_one_process_does(tmp_path: Path) -> None:
    """Under ``PROMETHEUS_MULTIPROC_DIR`` (gunicorn with several workers) every
    per-level family is labelled ``priority="1"`` and ``"2"`` as in one
    process, each number on its own level: the inputs waiting at level 2 on
    ``"2"``."""
    one = _leveled_scrape(tmp_path, multiprocess=False)
    many = _leveled_scrape(tmp_path, multiprocess=True)
    for samples in (one, many):
        for family in ("streamer_priority_requests_total", "streamer_priority_queue_wait_seconds_count",
                       "streamer_priority_queue_depth"):  # fmt: skip
            assert {dict(labels)["priority"] for sample, labels in samples if sample == family} == {"1", "2"}, family
        assert samples[("streamer_priority_queue_depth", (("priority", "2"),))] == 3
        assert samples[("streamer_priority_queue_depth", (("priority", "1"),))] == 0
        ok = {level: samples[("streamer_priority_requests_total", (("outcome", "ok"), ("priority", level)))]
              for level in ("1", "2")}  # fmt: skip
        assert ok == {"1": 1, "2": 2}, "answered before the scrape: one at level 1, two at level 2"
        waits = {level: samples[("streamer_priority_queue_wait_seconds_count", (("priority", level),))]
                 for level in ("1", "2")}  # fmt: skip
        assert waits == {"1": 1, "2": 2}
    assert one.keys() == many.keys(), "the same samples, labelled the same"
    timed = ("_sum", "_bucket")  # how long each input waited: not the same in two runs
    assert {key: value for key, value in one.items() if not key[0].endswith(timed)} == {
        key: value for key, value in many.items() if not key[0].endswith(timed)
    }


def test_inputs_a_cost_shaped_batch_leaves_behind_are_still_counted_as_waiting(closing: Callable[[Any], Any]) -> None:
    """With levels and batches shaped by cost, the inputs a batch's shaping
    leaves for later go back to their lines and count as waiting, in
    queued() and the queue's depth (the queue's bound and close()'s wait
    for it to drain read the same count)."""
    first, second = threading.Event(), threading.Event()

    def model(batch: List[Any]) -> List[Any]:
        if any(x.startswith("h1") for x in batch):
            first.wait(30)
        if any(x.startswith("h2") for x in batch):
            second.wait(30)
        return [len(x) for x in batch]

    streamer = closing(
        ThreadedStreamer(
            model, batch_size=8, max_latency=0.01, priority_levels=2, item_cost=len, batch_cost="sum",
            max_batch_cost=8, name=f"priority-{uuid.uuid4().hex[:8]}",
        )
    )  # fmt: skip
    try:
        held = streamer.submit(["h1"])
        assert wait_for(lambda: streamer.queued() == 0, 5)
        calls = [streamer.submit([x]) for x in ("h2xxxxx", "b", "cccccc", "d")]
        assert streamer.queued() == 4
        first.set()  # the next batch, shaped to a cost of 8: "h2xxxxx" and "b"; the other two wait
        assert wait_for(lambda: streamer.queued() == 2, 5), streamer.queued()
        assert streamer.stats().queue_depth == 2
    finally:
        first.set()
        second.set()
    assert held.result(10) == [2] and [c.result(10) for c in calls] == [[7], [1], [6], [1]]
