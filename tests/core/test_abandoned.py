"""Work for callers who are gone: an input whose call was cancelled
(``future.cancel()``, a task awaiting ``apredict`` cancelled) or whose
deadline passed while it waited is dropped before it is batched, on the
thread and the process backends; one already running completes and its
answer is dropped. (The Redis backend's are in tests/redis/test_abandoned.py.)"""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path
from typing import Any, Callable, Dict, List

import pytest
from prometheus_client import generate_latest

from streamer_core import Streamer, StreamerTimeoutError, ThreadedStreamer
from streamer_core.streamer import BaseStreamer
from tests.core import models
from tests.helpers import metric_samples, wait_for


class Busy:
    """A streamer of one backend whose model a test holds busy (an input
    ``"hold"``), and what reached its model."""

    def __init__(
        self,
        streamer: BaseStreamer,
        held: Any,
        batches: Callable[[], List[List[Any]]],
        release: Callable[[], None],
    ) -> None:
        self.streamer = streamer
        self.held = held  # the future of the batch running
        self.batches = batches
        self.release = release

    def seen(self) -> List[Any]:
        return [x for batch in self.batches() for x in batch]


@pytest.fixture(params=["thread", "process"])
def busy(request: Any, closing: Callable[[Any], Any], gate: Any, tmp_path: Path) -> Busy:
    """The model running a held batch: what is submitted now waits in the queue."""
    if request.param == "thread":
        streamer = closing(ThreadedStreamer(gate, batch_size=4, max_latency=0.01, timeout=30, name=_name()))
        held = streamer.submit(["hold"])
        assert gate.entered.wait(5)
        return Busy(streamer, held, lambda: gate.batches, gate.release)
    (tmp_path / "hold").write_text("")
    folder = {"folder": str(tmp_path)}
    streamer = closing(Streamer(models.RecordingGate, 4, 0.01, model_init_kwargs=folder, timeout=30, name=_name()))
    assert streamer.wait_ready(60)
    held = streamer.submit(["hold"])
    assert wait_for(lambda: (tmp_path / "inside").exists(), 10), "the held batch never reached the model"
    release = lambda: (tmp_path / "hold").unlink(missing_ok=True)  # noqa: E731
    return Busy(streamer, held, lambda: models.ran_batches(tmp_path), release)


def _name() -> str:
    return f"abandoned-{uuid.uuid4().hex[:8]}"


def _dropped(busy: Busy) -> Dict[str, int]:
    """The inputs dropped unrun so far, by reason, as stats() and a scrape say (they agree)."""
    dropped = busy.streamer.stats().dropped
    scraped = metric_samples(generate_latest().decode())
    model = busy.streamer.name
    for reason, count in dropped.items():
        assert scraped[("streamer_dropped_total", (("model", model), ("reason", reason)))] == count
    return {reason: count for reason, count in dropped.items() if count}


def _after(busy: Busy) -> None:
    """Let the model go, and see a later call answered: anything still
    queued before it has had its chance to run."""
    busy.release()
    assert busy.streamer.predict(["after"], timeout=20) == ["ok:after"]


def test_a_cancelled_call_never_reaches_the_model(busy: Busy) -> None:
    future = busy.streamer.submit(["cancelled", "cancelled-too"])
    assert future.cancel()
    _after(busy)
    assert busy.seen() == ["hold", "after"], "the model ran a call its caller had cancelled"
    assert _dropped(busy) == {"cancelled": 2}


def test_a_cancelled_input_takes_no_place_in_a_batch(busy: Busy) -> None:
    """Dropped before the batch forms, not after: the four live inputs
    behind a cancelled one fill one batch of ``batch_size`` (4)."""
    busy.streamer.submit(["cancelled"]).cancel()
    live = [busy.streamer.submit([x]) for x in "abcd"]
    _after(busy)
    assert [future.result(5) for future in live] == [[f"ok:{x}"] for x in "abcd"]
    assert busy.batches() == [["hold"], ["a", "b", "c", "d"], ["after"]]
    assert _dropped(busy) == {"cancelled": 1}


def test_an_expired_call_never_reaches_the_model(busy: Busy) -> None:
    """Nobody waits on it: the deadline alone takes it out of the queue."""
    future = busy.streamer.submit(["expired"], timeout=0.2)
    assert isinstance(future.exception(5), StreamerTimeoutError)
    _after(busy)
    assert busy.seen() == ["hold", "after"], "the model ran a call past its deadline"
    assert _dropped(busy) == {"expired": 1}


def test_a_caller_whose_wait_ran_out_leaves_nothing_to_run(busy: Busy) -> None:
    with pytest.raises(StreamerTimeoutError):
        busy.streamer.predict(["gave-up"], timeout=0.2)
    _after(busy)
    assert busy.seen() == ["hold", "after"]
    assert _dropped(busy) == {"expired": 1}


def test_a_cancelled_apredict_task_never_reaches_the_model(busy: Busy) -> None:
    async def give_up() -> None:
        task = asyncio.ensure_future(busy.streamer.apredict(["left"]))
        await asyncio.sleep(0.05)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(give_up())
    _after(busy)
    assert busy.seen() == ["hold", "after"]
    assert _dropped(busy) == {"cancelled": 1}


def test_a_call_cancelled_while_its_batch_runs_completes_and_is_dropped(busy: Busy) -> None:
    """Too late to drop: the model finishes the batch, the cancelled caller
    gets nothing, and the streamer goes on serving."""
    assert busy.held.cancel()
    _after(busy)
    assert busy.seen() == ["hold", "after"]
    assert busy.held.cancelled(), "the answer of a cancelled call was handed to it"
    assert _dropped(busy) == {}, "an input that ran counts as dropped"
