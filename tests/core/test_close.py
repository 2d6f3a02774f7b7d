"""close() and destroy_workers(): every pending call finished or failed,
every thread and process stopped, twice is fine, and calls afterwards fail."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from streamer_core import Streamer, StreamerClosedError, ThreadedStreamer
from tests.core import models
from tests.helpers import alive, close_answers_every_call, hold_answers, wait_for

ROOT = Path(__file__).resolve().parents[2]


def streamer_threads() -> set:
    return {t for t in threading.enumerate() if t.name.startswith("streamer-")}


def test_close_finishes_queued_and_running_calls():
    before = streamer_threads()
    streamer = ThreadedStreamer(lambda batch: (time.sleep(0.05), [x * 2 for x in batch])[1], batch_size=4)
    futures = [streamer.submit([x]) for x in range(20)]
    streamer.close()
    assert [f.result(0) for f in futures] == [[x * 2] for x in range(20)]
    assert wait_for(lambda: streamer_threads() == before, 2), "streamer threads are still running"


@pytest.mark.parametrize("backend", ["thread", "process"])
def test_close_waits_for_answers_on_their_way_to_their_calls(backend, monkeypatch):
    """A batch is done before its answers reach their calls; close() in
    between used to fail those calls with StreamerClosedError, their answers
    in hand. The way is made slow here (a loaded machine) by holding each
    batch's answers for 0.3 s before they are handed over."""
    import streamer_core.backends.process_messages as process_messages
    import streamer_core.backends.thread as thread_backend

    hold_answers(monkeypatch, thread_backend if backend == "thread" else process_messages, 0.3)
    if backend == "thread":
        streamer = ThreadedStreamer(models.double, batch_size=4, max_latency=0.01)
    else:
        streamer = Streamer(models.double, batch_size=4, max_latency=0.01)
    close_answers_every_call(streamer)


def test_close_fails_what_it_cannot_finish_in_time(gate):
    streamer = ThreadedStreamer(gate, batch_size=4, max_latency=0.01)
    running = streamer.submit(["hold"])
    assert gate.entered.wait(5)
    queued = streamer.submit(["queued"])
    started = time.monotonic()
    streamer.close(timeout=0.3)
    assert time.monotonic() - started < 3.0
    for future in (running, queued):
        with pytest.raises(StreamerClosedError, match="closed before this call finished"):
            future.result(0)


def test_calls_after_close_fail_clearly_and_close_twice_is_fine():
    streamer = ThreadedStreamer(models.double, batch_size=4)
    assert streamer.predict([1]) == [2]
    streamer.close()
    streamer.close()
    streamer.destroy_workers()
    assert streamer.closed
    with pytest.raises(StreamerClosedError, match="create a new one"):
        streamer.predict([1])
    with pytest.raises(StreamerClosedError):
        streamer.submit([1])


@pytest.mark.parametrize("timeout", [float("inf"), 1e12, -1])
def test_a_close_timeout_that_cannot_be_waited_is_refused_before_anything_stops(timeout):
    # close(inf) used to stop the queue, then overflow its timed wait, and
    # leave the worker processes running.
    streamer = Streamer(models.double, batch_size=4, worker_num=1)
    with pytest.raises(ValueError, match="close's timeout is in seconds"):
        streamer.close(timeout)
    assert not streamer.closed and streamer.predict([2]) == [4]
    workers = streamer.worker_pids()
    streamer.close(5)
    assert wait_for(lambda: not any(alive(pid) for pid in workers), 5), "a worker outlived close()"


def test_context_manager_closes():
    with ThreadedStreamer(models.double, batch_size=4) as streamer:
        assert streamer.predict([3]) == [6]
    assert streamer.closed


def test_destroy_workers_stops_every_process():
    before = streamer_threads()
    streamer = Streamer(models.double, batch_size=4, worker_num=2)
    assert streamer.wait_ready(60)
    pids = streamer.worker_pids()
    assert len(pids) == 2
    futures = [streamer.submit([x]) for x in range(10)]
    streamer.destroy_workers()
    assert [f.result(0) for f in futures] == [[x * 2] for x in range(10)]
    assert not any(alive(pid) for pid in pids), "a worker process outlived destroy_workers()"
    assert wait_for(lambda: streamer_threads() == before, 2)
    streamer.destroy_workers()
    with pytest.raises(StreamerClosedError):
        streamer.predict([1])


def test_a_dropped_streamer_stops_its_workers():
    streamer = Streamer(models.double, batch_size=4)
    assert streamer.wait_ready(60)
    [pid] = streamer.worker_pids()
    del streamer
    import gc

    gc.collect()
    assert wait_for(lambda: not alive(pid), 5), "a garbage-collected streamer left its worker running"


def test_close_stops_a_worker_stuck_in_its_model(tmp_path):
    (tmp_path / "hold").write_text("")
    streamer = Streamer(models.HoldModel, batch_size=4, model_init_kwargs={"folder": str(tmp_path)})
    assert streamer.wait_ready(60)
    [pid] = streamer.worker_pids()
    stuck = streamer.submit([1])
    assert wait_for(lambda: list(tmp_path.glob("inside-*")), 10)
    started = time.monotonic()
    streamer.close(timeout=0.5)
    assert time.monotonic() - started < 5.0
    with pytest.raises(StreamerClosedError):
        stuck.result(0)
    assert not alive(pid), "close() left a stuck worker running"


def test_a_worker_that_dies_while_closing_still_gets_its_calls_answered(tmp_path):
    (tmp_path / "hold").write_text("")
    streamer = Streamer(models.HoldModel, batch_size=4, model_init_kwargs={"folder": str(tmp_path)})
    assert streamer.wait_ready(60)
    [pid] = streamer.worker_pids()
    futures = [streamer.submit([x]) for x in range(3)]
    assert wait_for(lambda: list(tmp_path.glob("inside-*")), 10)
    closer = threading.Thread(target=streamer.close, kwargs={"timeout": 20})
    closer.start()
    time.sleep(0.2)  # close() is now draining, waiting on the held batch
    (tmp_path / "hold").unlink()
    os.kill(pid, signal.SIGKILL)
    assert [f.result(15) for f in futures] == [[0], [2], [4]]
    closer.join(20)
    assert not closer.is_alive()


AT_EXIT = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from streamer_core import Streamer, ThreadedStreamer
    from tests.core import models

    if __name__ == "__main__":
        backend, folder = sys.argv[1], sys.argv[2]
        if backend == "thread":
            model = models.GatedFailOnNegative()
            model.init_model(folder)
            streamer = ThreadedStreamer(model.predict, 4, 0.01)
        else:
            streamer = Streamer(models.GatedFailOnNegative, 4, 0.01, model_init_kwargs={"folder": folder})
            streamer.wait_ready(60)
        future = streamer.submit([0])  # held in the model until the test lets it go
        future.add_done_callback(lambda f: print("answered", f.result(), flush=True))
        while not any(Path(folder).glob("inside-*")):
            time.sleep(0.01)
        print("the program ends", flush=True)
    """
)


@pytest.mark.parametrize("backend", ["thread", "process"])
def test_a_batch_in_hand_when_the_program_ends_is_finished_and_answered(tmp_path, backend):
    """The program's main ends with a call in the model: the streamer's
    exit-time close lets the batch finish and its caller be answered, rather
    than the interpreter cutting it off."""
    (tmp_path / "hold").write_text("")
    script = tmp_path / "program.py"
    script.write_text(AT_EXIT)
    program = subprocess.Popen(
        [sys.executable, str(script), backend, str(tmp_path)], cwd=ROOT, stdout=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    try:
        assert program.stdout.readline().strip() == "the program ends"
        time.sleep(0.3)  # the interpreter is shutting down, the batch still in the model
        (tmp_path / "hold").unlink()
        output, _ = program.communicate(timeout=30)
    finally:
        program.kill()
    assert program.returncode == 0
    assert "answered [0]" in output, f"the batch in hand at exit was cut off: {output!r}"
