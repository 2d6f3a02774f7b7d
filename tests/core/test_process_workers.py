"""Spawned worker processes: devices, deaths, poison inputs, orphans, and
inputs that cannot cross the process boundary."""

from __future__ import annotations

import json
import logging
import os
import re
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Dict, List, Optional

import pytest

from streamer_core import (
    SerializationError,
    Streamer,
    StreamerError,
    StreamerTimeoutError,
    WorkerDiedError,
    WorkerStartError,
)
from tests.core import models
from tests.helpers import alive, run_program, wait_for
from tests.servers import worker_children

ROOT = Path(__file__).resolve().parents[2]


def test_each_worker_gets_its_device_slot(closing):
    streamer = closing(
        Streamer(
            models.EnvModel,
            batch_size=2,
            max_latency=0.01,
            worker_num=4,
            cuda_devices=[0, 1],
            model_init_kwargs={"tag": "emb", "delay": 0.05},
        )
    )
    assert streamer.wait_ready(60)
    with ThreadPoolExecutor(16) as pool:
        answers = [a for result in pool.map(lambda _: streamer.predict([0]), range(64)) for a in result]
    by_pid = {a["pid"]: a for a in answers}
    assert len(by_pid) == 4, "every worker should have served"
    devices = defaultdict(int)
    for answer in by_pid.values():
        assert answer["cvd"] == str(answer["gpu_id"]), "CUDA_VISIBLE_DEVICES must match the worker's device"
        assert answer["tag"] == "emb", "model_init_kwargs must reach init_model"
        devices[answer["cvd"]] += 1
    assert dict(devices) == {"0": 2, "1": 2}, "worker i should use cuda_devices[i % len(cuda_devices)]"


def test_a_device_as_torch_names_it_is_its_index(closing):
    """``cuda:1`` (torch's name) is the device 1: its worker gets
    ``CUDA_VISIBLE_DEVICES=1``. It was taken for a GPU UUID, which hides
    every GPU: the model ran on the CPU without a word."""
    streamer = closing(Streamer(models.EnvModel, batch_size=2, cuda_devices="cuda:1"))
    [answer] = streamer.predict([0])
    assert answer["gpu_id"] == 1 and answer["cvd"] == "1"


def test_without_cuda_devices_the_variable_is_left_alone(closing, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "7")
    streamer = closing(Streamer(models.EnvModel, batch_size=2))
    [answer] = streamer.predict([0])
    assert answer["gpu_id"] is None and answer["cvd"] == "7"


def answered_soon(folder: Path, killed_at: float, victim: int, alone: bool) -> None:
    """The calls of a killed worker were answered within 2 s of the kill
    where other workers run, or, where it was the only one (``alone``), of
    its replacement's load (README: dead workers); wall-clock seconds, as
    file times are."""
    since = killed_at
    if alone:
        loaded = [path.stat().st_mtime for path in folder.glob("loaded-*") if path.name != f"loaded-{victim}"]
        since = max([killed_at] + [mtime for mtime in loaded if mtime >= killed_at])
    assert time.time() - since < 2.0, "in-flight calls must be answered within 2 s of the kill or the replacement"


def held_streamer(closing: Any, folder: Path, **options: Any) -> Streamer:
    """A started Streamer of ``HoldModel`` (``max_latency`` 0.05 s) whose
    batches wait in the model, each announcing itself in ``folder``, while
    the file ``hold`` there exists (made here)."""
    (folder / "hold").write_text("")
    streamer = closing(
        Streamer(models.HoldModel, max_latency=0.05, model_init_kwargs={"folder": str(folder)}, **options)
    )
    assert streamer.wait_ready(60)
    return streamer


@pytest.mark.parametrize("worker_num", [2, 1])
def test_a_worker_killed_mid_batch_loses_no_call(closing, tmp_path, worker_num):
    streamer = held_streamer(closing, tmp_path, batch_size=8, worker_num=worker_num)
    futures = [streamer.submit([x]) for x in range(8)]
    assert wait_for(lambda: list(tmp_path.glob("inside-*")), 10), "no worker started the batch"
    [marker] = tmp_path.glob("inside-*")
    victim = int(marker.name.split("-")[1])
    (tmp_path / "hold").unlink()
    os.kill(victim, signal.SIGKILL)
    killed_at = time.time()
    for x, future in enumerate(futures):
        assert future.result(5) == [x * 2]
    answered_soon(tmp_path, killed_at, victim, alone=worker_num == 1)
    # The dead worker was replaced and the streamer keeps serving.
    assert wait_for(lambda: len(streamer.worker_pids()) == worker_num and victim not in streamer.worker_pids(), 10)
    assert streamer.predict(list(range(20))) == [x * 2 for x in range(20)]


def test_a_worker_killed_holding_the_next_batch_too_loses_no_call(closing, tmp_path):
    """Under load a busy worker is sent the next full batch ahead; killed,
    it takes both batches with it, and both are run again."""
    streamer = held_streamer(closing, tmp_path, batch_size=4)
    futures = [streamer.submit([x]) for x in range(12)]
    assert wait_for(lambda: list(tmp_path.glob("inside-*")), 10)
    [slot] = streamer._backend._slots
    assert wait_for(lambda: len(slot.batches) == 2, 5), "the next full batch should have been sent ahead"
    (tmp_path / "hold").unlink()
    victim = slot.pid
    os.kill(victim, signal.SIGKILL)
    killed_at = time.time()
    assert [f.result(5) for f in futures] == [[x * 2] for x in range(12)]
    answered_soon(tmp_path, killed_at, victim, alone=True)


def test_the_inputs_of_a_crashed_batch_run_again_while_the_load_goes_on(closing):
    """The only worker killed while it held a full batch sent ahead, under a
    load that keeps a full batch waiting: the inputs of the batch it ran
    are run again (alone) by its replacement soon after it answers, not
    left until their timeout. Only a free worker takes them, and a worker
    handed the next full batch ahead each time is never free."""
    streamer = closing(Streamer(models.slow_double, batch_size=4, max_latency=0.01, worker_num=1, timeout=15.0))
    assert streamer.wait_ready(30)
    stop = threading.Event()
    started: Dict[int, Optional[float]] = {}  # caller -> when its call in flight started
    answered: List[float] = []
    errors: List[BaseException] = []

    def caller(n: int) -> None:  # 16 callers in closed loops: four batches' worth
        while not stop.is_set():
            started[n] = time.monotonic()
            try:
                assert streamer.predict([n]) == [2 * n]
                answered.append(time.monotonic())
            except BaseException as exc:
                errors.append(exc)
            started[n] = None

    callers = [threading.Thread(target=caller, args=(n,), daemon=True) for n in range(16)]
    for thread in callers:
        thread.start()
    try:
        [slot] = streamer._backend._slots
        assert wait_for(lambda: len(answered) >= 40, 20), "the load should be steady: ten batches answered"
        assert wait_for(lambda: len(slot.batches) == 2, 10), "under this load a full batch is sent ahead"
        os.kill(slot.pid, signal.SIGKILL)
        killed = time.monotonic()
        assert wait_for(lambda: bool(answered) and answered[-1] > killed, 20), "nothing answered after the kill"
        assert wait_for(lambda: all(t is None or t > killed for t in list(started.values())), 5), (
            "calls made before the kill still wait, 5 s after the replacement answered"
        )
    finally:
        stop.set()
        for thread in callers:
            thread.join(20)
    assert not errors, errors[:3]


def test_the_batch_sent_ahead_to_a_worker_that_died_is_not_counted_as_crashed(closing, tmp_path):
    """With max_item_crashes=1 the batch the worker ran fails at once, but
    the one sent ahead never reached the model: it runs again, batched."""
    streamer = held_streamer(closing, tmp_path, batch_size=4, max_item_crashes=1)
    futures = [streamer.submit([x]) for x in range(8)]
    assert wait_for(lambda: list(tmp_path.glob("inside-*")), 10)
    [slot] = streamer._backend._slots
    assert wait_for(lambda: len(slot.batches) == 2, 5), "the next full batch should have been sent ahead"
    ran = {item.task.future for item in slot.batches[0].items}
    os.kill(slot.pid, signal.SIGKILL)  # then let the worker that replaces it run
    (tmp_path / "hold").unlink()
    for x, future in enumerate(futures):
        if future in ran:
            with pytest.raises(WorkerDiedError, match="not retried"):
                future.result(10)
        else:
            assert future.result(10) == [x * 2]
    assert len(ran) == 4


def test_callers_beside_an_input_the_worker_cannot_unpickle_get_their_own_results(closing):
    """An input the worker cannot unpickle fails alone; the outcomes of the
    inputs after it in the batch stay in their places (shifted, the last
    slot came back empty and the whole batch waited for its timeout)."""
    streamer = closing(Streamer(models.unbox, batch_size=4, max_latency=0.5, worker_num=1, timeout=8.0))
    assert streamer.wait_ready(60)
    first = streamer.submit(["sleep"])
    time.sleep(0.3)  # the next four calls fill one batch, handed ahead
    futures = [streamer.submit([models.Box(v, poisoned=v == 2)]) for v in (1, 2, 3, 4)]
    assert first.result(10) == ["slept"]
    with pytest.raises(SerializationError, match="could not unpickle this input"):
        futures[1].result(10)
    assert [futures[i].result(10) for i in (0, 2, 3)] == [[10], [30], [40]]


class _SlowOnRestart(logging.Handler):
    """A logging handler that takes its time over the line saying a worker
    is restarted, as one writing to a slow disk or a network may: the
    restart is then slower than the next batch's forming."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.seen = threading.Event()

    def emit(self, record: logging.LogRecord) -> None:
        if "restarting it" in record.getMessage() and not self.seen.is_set():
            self.seen.set()
            time.sleep(0.5)


def test_a_batch_formed_for_a_worker_that_just_died_is_run_by_its_replacement():
    """The batch handed to a slot whose worker has died is given back to be
    formed again, and the backend's lock with it: neither the call nor
    close() waits forever."""
    handler = _SlowOnRestart()
    logger = logging.getLogger("streamer_core")
    logger.addHandler(handler)
    streamer = Streamer(models.double, batch_size=4, max_latency=0.01, worker_num=1, timeout=15.0)
    try:
        assert streamer.wait_ready(60)
        assert streamer.submit([1]).result(10) == [2]
        os.kill(streamer.worker_pids()[0], signal.SIGKILL)
        assert handler.seen.wait(10)
        assert streamer.submit([3]).result(14) == [6]  # formed for the dead worker
    finally:
        logger.removeHandler(handler)
        closer = threading.Thread(target=streamer.close, kwargs={"timeout": 5}, daemon=True)
        closer.start()
        closer.join(15)
    assert not closer.is_alive(), "close() hung: the backend's lock was never released"


def test_an_input_that_kills_workers_fails_clearly_and_spares_the_others(closing):
    streamer = closing(Streamer(models.kill_self_on_poison, batch_size=8, max_latency=0.2, worker_num=2))
    assert streamer.wait_ready(60)
    inputs = ["a", "b", "poison", "c", "d"]
    with ThreadPoolExecutor(len(inputs)) as pool:
        futures = list(pool.map(lambda s: streamer.submit([s]), inputs))
    for text, future in zip(inputs, futures):
        if text == "poison":
            with pytest.raises(WorkerDiedError, match="killed by SIGKILL") as info:
                future.result(20)
            assert "not retried" in str(info.value)
        else:
            assert future.result(20) == [text.upper()]
    assert wait_for(lambda: len(streamer.worker_pids()) == 2, 10), "dead workers should be replaced"
    assert streamer.predict(["still", "serving"]) == ["STILL", "SERVING"]


ASKS_AS_A_WORKER_DIES = textwrap.dedent(
    """
    import json, threading
    from streamer_core import Streamer, WorkerDiedError
    from tests.core import models

    if __name__ == "__main__":
        streamer = Streamer(models.kill_self_on_poison, batch_size=8, max_latency=0.01, max_item_crashes=1)
        assert streamer.wait_ready(60)
        seen, answered = [], threading.Event()

        def ask(future):
            seen.append(streamer.live_workers())
            answered.set()

        future = streamer.submit(["poison"])
        future.add_done_callback(ask)
        try:
            future.result(20)
        except WorkerDiedError:
            pass
        print(json.dumps({"answered": answered.wait(10), "seen": seen}), flush=True)
        print(json.dumps(streamer.predict(["still", "serving"], timeout=20)), flush=True)
        streamer.close(5)
    """
)


def test_a_done_callback_may_ask_the_streamer_of_its_workers_as_a_worker_dies(tmp_path):
    """A call failed by a worker's death runs its done-callbacks on the
    thread that saw the death; one that asks the streamer for its workers
    (a health check, a log line) gets an answer, and the streamer goes on:
    the backend fails the calls after letting go of its own lock. Run in a
    program of its own: a deadlock would leave that lock held, and the
    streamer could not be closed."""
    script = tmp_path / "asks.py"
    script.write_text(ASKS_AS_A_WORKER_DIES)
    done = run_program(script, timeout=90)
    lines = done.stdout.splitlines()
    assert done.returncode == 0 and len(lines) == 2, done.stdout + done.stderr[-3000:]
    asked = json.loads(lines[0])
    assert asked["answered"], "the done-callback never got its answer: the backend's lock was held"
    assert asked["seen"][0] in (0, 1)
    assert json.loads(lines[1]) == ["STILL", "SERVING"]


KILLED_AFTER_A_PROGRESS_BAR = textwrap.dedent(
    """
    import os, signal, time
    from streamer_core import Streamer
    from tests.core.models import ProgressBarModel


    def main():
        streamer = Streamer(ProgressBarModel, batch_size=4, max_latency=0.01)
        assert streamer.wait_ready(60)
        [first] = streamer.predict([1], timeout=30)
        os.kill(first, signal.SIGKILL)  # as the out-of-memory killer does
        deadline, now = time.monotonic() + 60, first
        while now == first and time.monotonic() < deadline:
            try:
                [now] = streamer.predict([1], timeout=30)
            except Exception:
                pass  # the call the dying worker held
        assert now != first, "the worker was not restarted"
        streamer.close(10)
        print("ok")


    if __name__ == "__main__":
        main()
    """
)


def test_a_worker_killed_after_drawing_a_progress_bar_leaves_no_semaphore_behind(tmp_path):
    """tqdm, as transformers draws its loading bar, makes a multiprocessing
    lock: in a spawned worker a named semaphore, which a worker killed by
    SIGKILL (the out-of-memory killer) cannot remove, and the resource
    tracker warned of it as the server stopped. Workers give tqdm a thread
    lock first. Run in a program of its own, whose end the tracker sees."""
    pytest.importorskip("tqdm")
    script = tmp_path / "killed.py"
    script.write_text(KILLED_AFTER_A_PROGRESS_BAR)
    done = run_program(script, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stdout + done.stderr[-3000:]
    assert "leaked" not in done.stderr, done.stderr[-3000:]


def test_a_worker_stuck_in_a_batch_nobody_waits_for_is_restarted(closing, caplog):
    streamer = closing(Streamer(models.stuck_on_hang, batch_size=4, max_latency=0.01, hang_timeout=0.5))
    assert streamer.wait_ready(60)
    [stuck] = streamer.worker_pids()
    with pytest.raises(StreamerTimeoutError):
        streamer.predict(["hang"], timeout=1)
    # Without the watchdog every later call would time out as well, for good.
    assert streamer.predict(["after"], timeout=30) == ["AFTER"]
    assert not alive(stuck) and streamer.worker_pids() != [stuck]
    assert "taken for hung (hang_timeout=0.5s)" in caplog.text


def test_a_hung_worker_is_killed_soon_after_its_last_caller_gives_up(closing, caplog):
    """Workers are looked at every quarter of ``hang_timeout`` (a second at
    most): a worker stuck past a short one is killed within a fraction of a
    second of its last caller giving up, not at the next whole second.
    Three times, as a check that came a second apart would still fall
    within the bound now and then."""
    streamer = closing(Streamer(models.stuck_on_hang, batch_size=4, max_latency=0.01, hang_timeout=0.2))
    assert streamer.wait_ready(60)
    for attempt in range(3):
        kills = caplog.text.count("taken for hung")
        with pytest.raises(StreamerTimeoutError):
            streamer.predict(["hang"], timeout=0.3)
        gave_up = time.monotonic()
        assert wait_for(lambda kills=kills: caplog.text.count("taken for hung") > kills, 10, interval=0.01)
        assert time.monotonic() - gave_up < 0.5, f"round {attempt}: killed {time.monotonic() - gave_up:.2f} s after"
        assert streamer.predict(["answered"], timeout=30) == ["ANSWERED"]  # its hang_timeout back to 0.2 s


def test_a_worker_sent_sigterm_exits_through_exit_and_is_said_so(closing, caplog):
    """SIGTERM to a worker (alone, or with its server's process group) ends
    it through ``sys.exit``, so what its model made is cleaned up, and the
    parent says it exited on SIGTERM as it restarts it."""
    streamer = closing(Streamer(models.double, batch_size=4, max_latency=0.01))
    assert streamer.wait_ready(60)
    [worker] = streamer.worker_pids()
    os.kill(worker, signal.SIGTERM)
    assert wait_for(lambda: "exited on SIGTERM; restarting it" in caplog.text, 30), (caplog.text, alive(worker))
    assert f"(pid {worker}) exited on SIGTERM" in caplog.text
    assert streamer.predict([4], timeout=30) == [8]


def test_a_worker_sent_sigterm_while_loading_is_restarted_not_taken_for_a_model_that_cannot_load(
    closing, caplog, tmp_path
):
    streamer = closing(Streamer(models.MarkedSlowLoading, 4, 0.01, model_init_kwargs={"folder": str(tmp_path)}))
    assert wait_for(lambda: list(tmp_path.glob("loading-*")), 60)
    [mark] = tmp_path.glob("loading-*")
    os.kill(int(mark.name.split("-")[1]), signal.SIGTERM)  # inside init_model
    assert streamer.wait_ready(60), caplog.text
    assert streamer.predict(["x"], timeout=30) == ["x"]
    assert "exited on SIGTERM; restarting it" in caplog.text and "could not" not in caplog.text, caplog.text


def test_each_kill_for_hanging_doubles_the_wait_until_the_worker_answers(closing, caplog):
    # A batch that is only slow (a first call that compiles) must end up
    # finishing, not be killed over and over.
    streamer = closing(Streamer(models.stuck_on_hang, batch_size=4, max_latency=0.01, hang_timeout=0.5))
    assert streamer.wait_ready(60)

    def stuck_once() -> None:
        kills = caplog.text.count("taken for hung")
        with pytest.raises(StreamerTimeoutError):
            streamer.predict(["hang"], timeout=1)
        assert wait_for(lambda: caplog.text.count("taken for hung") > kills, 30)
        assert wait_for(lambda: "restarting it" in caplog.text.rsplit("taken for hung", 1)[1], 10)
        assert streamer.wait_ready(60)

    stuck_once()
    stuck_once()
    limits = re.findall(r"hang_timeout=([0-9.]+)s\), it is killed", caplog.text)
    assert limits == ["0.5", "1"], caplog.text
    assert streamer.predict(["answered"], timeout=30) == ["ANSWERED"]
    caplog.clear()
    stuck_once()
    assert re.findall(r"hang_timeout=([0-9.]+)s\), it is killed", caplog.text) == ["0.5"], "not reset by an answer"


def test_a_long_batch_whose_caller_still_waits_is_not_taken_for_hung(closing):
    streamer = closing(Streamer(models.stuck_on_hang, batch_size=4, max_latency=0.01, hang_timeout=0.5))
    assert streamer.wait_ready(60)
    pids = streamer.worker_pids()
    assert streamer.predict(["slow"], timeout=20) == ["SLOW"]  # 1.5 s, three times hang_timeout
    assert streamer.worker_pids() == pids


def test_a_batch_one_of_whose_callers_still_waits_is_not_taken_for_hung(closing, caplog):
    """A batch is taken for hung only while *none* of its callers waits: one
    caller giving up on a shared batch does not get it killed under the other."""
    streamer = closing(Streamer(models.stuck_on_hang, batch_size=4, max_latency=0.05, hang_timeout=0.5))
    assert streamer.wait_ready(60)
    pids = streamer.worker_pids()
    first = streamer.submit(["slow"])  # the worker runs it for 1.5 s; the next two queue meanwhile
    time.sleep(0.2)
    waiting, leaving = streamer.submit(["slow"]), streamer.submit(["x"])  # one batch, sent when the worker is free
    with pytest.raises(StreamerTimeoutError):
        leaving.result(timeout=2.0)  # gives up while that batch runs (1.5 s to 3.0 s)
    assert waiting.result(timeout=20) == ["SLOW"] and first.result(timeout=20) == ["SLOW"]
    assert "taken for hung" not in caplog.text, caplog.text
    assert streamer.worker_pids() == pids


def test_a_batch_sent_ahead_is_timed_from_when_the_worker_started_it(closing):
    """A batch sent while the worker ran another ran from when that one
    ended: timed from when it was sent, the quick batches sent ahead of
    three slow ones would look slow, and a call that a quick batch answers
    in time would be refused as one the model could not answer in time."""
    streamer = closing(Streamer(models.stuck_on_hang, batch_size=4, max_latency=0.01))
    assert streamer.wait_ready(60)
    [slot] = streamer._backend._slots
    for _ in range(3):
        slow = streamer.submit(["slow"])  # 1.5 s
        time.sleep(0.3)
        quick = [streamer.submit([x]) for x in "abcd"]  # a full batch: sent ahead, run right after the slow one
        assert wait_for(lambda: len(slot.batches) == 2, 5), "the next full batch should have been sent ahead"
        assert slow.result(timeout=20) == ["SLOW"]
        assert [f.result(timeout=20) for f in quick] == [["A"], ["B"], ["C"], ["D"]]
    assert streamer.predict(["in time"], timeout=0.5) == ["IN TIME"]


@pytest.mark.parametrize("value", [0, -1, float("inf"), "60"])
def test_a_bad_hang_timeout_is_refused(value):
    with pytest.raises((TypeError, ValueError), match="hang_timeout is in seconds"):
        Streamer(models.double, batch_size=4, hang_timeout=value)


def test_a_worker_that_dies_while_loading_is_given_up_after_three_deaths(closing, caplog):
    """A worker dying before its model is ready is started again, with a
    growing pause, and given up for good at its third death in a row: calls
    then fail at once, saying so."""
    streamer = closing(Streamer(models.DiesWhileLoading, batch_size=4))
    with pytest.raises(WorkerStartError, match="died 3 times while loading the model"):
        streamer.wait_ready(60)
    with pytest.raises(WorkerStartError, match="died 3 times while loading the model"):
        streamer.predict([1], timeout=5)
    assert caplog.text.count("exited with code 9; restarting it") == 2, caplog.text
    assert caplog.text.count("exited with code 9; giving it up") == 1, caplog.text


def test_a_model_that_cannot_load_fails_calls_with_its_error(closing):
    streamer = closing(Streamer(models.BrokenInitModel, batch_size=4, worker_num=2))
    with pytest.raises(WorkerStartError, match="weights.bin not found"):
        streamer.wait_ready(60)
    started = time.monotonic()
    with pytest.raises(WorkerStartError, match="weights.bin not found") as info:
        streamer.predict([1])
    assert time.monotonic() - started < 1.0, "calls must fail at once, not wait for a timeout"
    assert "init_model" in str(info.value.__cause__), "the worker's traceback should be attached"
    # A model that cannot load is not started again and again: no new worker
    # process ever appears beyond the two that failed.
    seen = set()
    deadline = time.monotonic() + 1.5
    while time.monotonic() < deadline:
        seen.update(streamer.worker_pids())
        time.sleep(0.02)
    assert len(seen) <= 2, f"workers whose init_model raised were restarted: pids {sorted(seen)}"
    assert streamer.worker_pids() == []


def test_unpicklable_inputs_fail_at_once_naming_the_cause(closing):
    streamer = closing(Streamer(models.double, batch_size=4))
    with pytest.raises(SerializationError, match=r"input 1 \(lock\) cannot be sent to a worker process") as info:
        streamer.predict([1, threading.Lock()])
    assert isinstance(info.value, TypeError)
    assert streamer.predict([1, 2]) == [2, 4]


def test_a_lambda_model_is_refused_with_a_clear_message():
    with pytest.raises(TypeError, match="define it at module level"):
        Streamer(lambda batch: batch, batch_size=4)


def test_a_class_that_is_not_a_managed_model_is_refused():
    class NotManaged:
        pass

    with pytest.raises(TypeError, match="not a ManagedModel subclass"):
        Streamer(NotManaged, batch_size=4)


PARENT = textwrap.dedent(
    """
    import sys, time
    from streamer_core import Streamer
    from tests.core import models

    if __name__ == "__main__":
        streamer = Streamer(models.HoldModel, batch_size=4, worker_num=2,
                            model_init_kwargs={"folder": sys.argv[1]})
        streamer.wait_ready(60)
        streamer.submit([1])  # one worker sits inside the model while the parent dies
        print(" ".join(map(str, streamer.worker_pids())), flush=True)
        time.sleep(60)
    """
)


def test_workers_exit_when_their_parent_dies(tmp_path):
    """The README's promise: within 0.2 s of the parent's death (they look
    every 0.2 s), even a worker in the middle of a model call. Asserted with
    a margin a busy machine holds: 0.5 s."""
    (tmp_path / "hold").write_text("")
    script = tmp_path / "parent.py"
    script.write_text(PARENT)
    with subprocess.Popen(
        [sys.executable, str(script), str(tmp_path)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    ) as parent:
        try:
            pids = [int(p) for p in parent.stdout.readline().split()]
            assert len(pids) == 2
            assert wait_for(lambda: list(tmp_path.glob("inside-*")), 10)
            parent.kill()
            parent.wait(5)
            died = time.monotonic()
            assert wait_for(lambda: not any(alive(pid) for pid in pids), 5, 0.005), "workers outlived their parent"
            assert time.monotonic() - died < 0.5, f"workers took {time.monotonic() - died:.2f}s to follow their parent"
        finally:
            parent.kill()


IMPORTS_APP = textwrap.dedent(
    """
    from streamer_core import Streamer
    from tests.core import models

    streamer = Streamer(models.double, batch_size=4)   # at import time, unguarded


    def predict(batch):
        return models.double(batch)
    """
)


def test_a_worker_that_imports_the_streamers_module_does_not_spawn_more(tmp_path, closing):
    """Importing the app module inside a worker must not start workers again."""
    (tmp_path / "app_module.py").write_text(IMPORTS_APP)
    sys.path.insert(0, str(tmp_path))
    try:
        import app_module  # noqa: F401  (creates a streamer in this process, which is fine)

        closing(app_module.streamer)
        streamer = closing(Streamer(app_module.predict, batch_size=4))
        with pytest.raises(WorkerStartError, match="created inside one of its own worker processes"):
            streamer.wait_ready(60)
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("app_module", None)


def test_streamer_error_is_the_root_of_every_error():
    for error in (SerializationError, WorkerDiedError, WorkerStartError):
        assert issubclass(error, StreamerError)


def _kill_the_worker_in_a_call(streamer: Streamer, marker: Path) -> None:
    """Kill ``streamer``'s one worker while a call sleeps in its model
    (``marker`` says it is there), and see the call fail for it."""
    assert streamer.wait_ready(60)
    [pid] = streamer.worker_pids()
    future = streamer.submit([f"hold:{marker}"])  # sleeps in the model
    assert wait_for(marker.exists, 30)
    os.kill(pid, signal.SIGKILL)
    with pytest.raises(WorkerDiedError):
        future.result(30)


def test_close_right_after_a_worker_dies_leaves_no_worker_behind(tmp_path):
    """The collector restarts a dead worker at once; a close() that overtakes
    the restart must still stop (and wait for) the new process."""
    marker = tmp_path / "in-model"
    for attempt in range(5):
        streamer = Streamer(models.big_arrays, batch_size=1, max_item_crashes=1)
        try:
            _kill_the_worker_in_a_call(streamer, marker)
        finally:
            streamer.close(timeout=10)
        assert worker_children(os.getpid()) == [], f"a worker outlived close() (attempt {attempt})"
        marker.unlink()


def test_a_batch_lost_with_its_dead_worker_is_not_waited_for_at_close(closing, tmp_path, caplog):
    """The batch a dead worker held is no longer out: once its call has
    failed, close() has nothing to wait for, and says nothing unfinished
    (counted as still out, it would wait its whole timeout, then warn)."""
    streamer = closing(Streamer(models.big_arrays, batch_size=1, max_item_crashes=1))
    _kill_the_worker_in_a_call(streamer, tmp_path / "in-model")
    started = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="streamer_core"):
        streamer.close(timeout=20)
    assert [r.getMessage() for r in caplog.records if "unfinished" in r.getMessage()] == []
    assert time.monotonic() - started < 15, "close waited out its timeout for a batch no worker holds"


def test_a_closed_streamer_dropped_lets_go_of_its_workers_descriptors_at_once(tmp_path):
    """A closed streamer, once dropped, is freed by its reference count, not
    left to the cyclic collector: what its workers held open in this process
    (each spawned process's pipes) is closed then, with the collector off."""
    script = tmp_path / "drop.py"
    script.write_text(
        textwrap.dedent(
            """
            import gc, os
            from streamer_core import Streamer
            from tests.core import models

            def open_fds():
                return len(os.listdir("/proc/self/fd"))

            def serve_once():
                streamer = Streamer(models.big_arrays, batch_size=1)
                assert streamer.wait_ready(60)
                streamer.predict([1])
                streamer.close(timeout=10)

            if __name__ == "__main__":
                serve_once()  # what stays for the process's life (the resource tracker) opens here
                gc.collect()
                gc.disable()
                before = open_fds()
                for _ in range(3):
                    serve_once()
                print(before, open_fds())
            """
        )
    )
    done = run_program(script, timeout=120)
    assert done.returncode == 0, done.stderr
    before, after = map(int, done.stdout.split())
    assert after == before, f"{after - before} descriptors stay open after three streamers were closed and dropped"


def test_wait_ready_returns_once_the_workers_say_they_are_ready(closing):
    """The ready message wakes wait_ready(): it returns as the worker has
    loaded, not when its timeout runs out (40 s here; a spawned worker of
    this small model is ready in seconds, even on a loaded machine)."""
    started = time.monotonic()
    streamer = closing(Streamer(models.double, batch_size=2, worker_num=1))
    assert streamer.wait_ready(40)
    assert time.monotonic() - started < 30, "wait_ready waited out its timeout: the ready message never woke it"


def test_a_start_that_fails_leaves_no_descriptor_open(tmp_path):
    """A worker process that cannot be started (here: an ``oom_errors``
    class defined in a function, which cannot be pickled for it) fails the
    streamer's construction with the reason, and what was opened for it
    (its pipe, the backend's wake-up pipe) is closed before it raises, not
    left to the cyclic collector."""
    script = tmp_path / "fail_start.py"
    script.write_text(
        textwrap.dedent(
            """
            import gc, os
            from streamer_core import Streamer
            from tests.core import models

            def local_error():
                class Local(Exception):
                    pass
                return Local

            if __name__ == "__main__":
                Streamer(models.double, batch_size=1).close(timeout=10)  # what stays for the process's life
                gc.collect()
                gc.disable()
                before = len(os.listdir("/proc/self/fd"))
                for _ in range(3):
                    try:
                        Streamer(models.double, batch_size=1, oom_errors=(local_error(),))
                    except AttributeError as exc:
                        assert "pickle" in str(exc), exc
                    else:
                        raise SystemExit("the streamer started")
                print(before, len(os.listdir("/proc/self/fd")))
            """
        )
    )
    done = run_program(script, timeout=120)
    assert done.returncode == 0, done.stderr
    before, after = map(int, done.stdout.split())
    assert after == before, f"{after - before} descriptors stay open after three starts failed"


def test_a_worker_keeps_what_loading_made_out_of_the_collectors_sight(closing):
    """gc.freeze() once the model is loaded: the collector's full passes no
    longer walk the model and its libraries' objects with a batch in hand."""
    streamer = closing(Streamer(models.frozen_objects, batch_size=2, max_latency=0.01, worker_num=1))
    [frozen] = streamer.predict([0])
    assert frozen > 0


def test_under_a_host_program_workers_run_this_environments_python(monkeypatch):
    """Where ``sys.executable`` is not Python (uWSGI's own binary), workers
    are spawned with the python of this environment (the virtualenv's, whose
    packages the model needs), not the base interpreter it was made from."""
    from streamer_core.backends.spawning import python_executable

    assert python_executable() is None  # under Python itself: multiprocessing's own choice
    monkeypatch.setattr(sys, "executable", os.path.join(sys.prefix, "bin", "uwsgi"))
    chosen = python_executable()
    major, minor = sys.version_info[:2]
    assert chosen == os.path.join(sys.prefix, "bin", f"python{major}.{minor}")
