"""Under gevent's ``monkey.patch_all()`` (gunicorn's gevent workers patch
everything) the streamer's threads are greenlets: the thread backend's model
call must run off the hub, or the whole server stops for its duration, and
the process backend's pipes and worker threads must still block as they do
unpatched."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import run_program

pytest.importorskip("gevent")

SCRIPT = Path(__file__).with_name("scripts") / "gevent_patched_model.py"


def test_a_computing_model_does_not_stop_the_hub() -> None:
    done = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["results"] == [[2 * i] for i in range(10)]
    assert max(report["sizes"]) > 1, "callers waiting together were not batched"
    # Each model call computes for 0.3 s; on the hub, one tick would wait that long.
    assert report["max_gap"] < 0.2, f"the hub stopped for {report['max_gap']:.3f} s during a model call"


PROCESS_SCRIPT = Path(__file__).with_name("scripts") / "gevent_patched_process.py"


@pytest.mark.parametrize("workers_patched", [False, True], ids=["parent-patched", "workers-patched-too"])
def test_the_process_backend_works_under_patching(workers_patched: bool) -> None:
    """Patched, the pipe to a worker is a gevent socketpair, non-blocking for
    the hub: a worker that inherited it read EAGAIN, took it for its parent
    gone and exited (code 0) with its batch, and a send to a full pipe was
    dropped. A worker patched too (by a ``patch_all()`` atop the script it
    imports again) ran its pipe reader as a greenlet that stopped its model
    loop. Every call comes back right and the worker is never replaced."""
    env = {**os.environ, "PATCH_WORKERS_TOO": "1" if workers_patched else "0"}
    done = subprocess.run([sys.executable, str(PROCESS_SCRIPT)], capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["errors"] == [], report["errors"]
    assert report["right"] == 210
    assert report["after"] == report["before"], f"the worker was replaced: {done.stderr[-2000:]}"


CONDITION_SCRIPT = """
from gevent import monkey
monkey.patch_all()
import json, threading
import gevent
from streamer_core.green import Condition
ran = []
cond = Condition()
gevent.spawn(ran.append, "other greenlet")
with cond:
    cond.notify_all()  # the standard Condition yielded here, its lock held
    switched = list(ran)
try:
    cond.notify()
    unheld = "no error"
except RuntimeError as exc:
    unheld = str(exc)
gevent.sleep(0)
print(json.dumps({"switched": switched, "after": ran, "unheld": unheld, "lock": type(cond._lock).__module__}))
"""


def test_notify_does_not_yield_to_the_hub_with_the_lock_held() -> None:
    """The scheduler's, the process backend's and the Redis worker's
    conditions. Patched, the standard ``threading.Condition`` over a plain
    lock yields to the hub on every ``notify()`` while its lock is held (it
    tries the lock to tell that the caller holds it); greenlets then queued on
    that lock lost it again to the notifier's next turn, and a gunicorn
    gevent worker on the process backend served 160 requests a second at
    100% CPU instead of 2,400. Waiting and the check that the caller holds
    the lock are kept."""
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run(
        [sys.executable, "-c", CONDITION_SCRIPT], capture_output=True, text=True, timeout=60, cwd=root
    )
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["lock"].startswith("gevent"), "the lock was not gevent's: nothing was patched"
    assert report["switched"] == [], "notify() let another greenlet run with the lock held"
    assert report["after"] == ["other greenlet"]
    assert "un-acquired lock" in report["unheld"]


def test_an_input_the_model_refuses_fails_its_caller_without_a_traceback_on_stderr() -> None:
    """gevent prints the traceback of whatever a function run on its thread
    pool raises before handing it back: under a gevent worker, every bad
    input a client sent printed one to the server's log (a flood, from a
    hostile client). The model's error reaches its caller alone and quietly."""
    done = run_program(Path(__file__).with_name("scripts") / "gevent_model_errors.py", timeout=60)
    assert done.returncode == 0, done.stderr
    answers = json.loads(done.stdout.strip().splitlines()[-1])
    assert answers[0::2] == [2, 4, 6], answers
    assert all(a.startswith("refused: no negative numbers: [-") for a in answers[1::2]), answers
    assert "Traceback" not in done.stderr and "Refused" not in done.stderr, done.stderr


def test_patched_greenlets_wait_on_the_hubs_shared_watcher() -> None:
    """Patched as unpatched, a greenlet waits for its batch on the hub's one
    async watcher, which the batch's results signal once: a gevent lock wait
    instead cost the hub a cross-thread callback per caller and each wait a
    ``Timeout`` (``bench/green_wait.py``: 0.86x the CPU a call). A caller
    that looks at its client between waits keeps that wake in each later
    wait, without the future's condition and callbacks."""
    done = run_program(Path(__file__).with_name("scripts") / "gevent_patched_wait.py", timeout=60)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["patched"] is True
    assert report["answers"] == [[2 * i] for i in range(48)], report["answers"]
    assert sum(report["wakes"]) == 48, f"not every caller was woken by the shared watcher: {report['wakes']}"
    assert len(report["wakes"]) <= len(report["batches"]) + 2, (
        f"{len(report['wakes'])} hub wakes for {len(report['batches'])} batches: the results did not wake it together"
    )
    assert report["conditions"] == 0, f"{report['conditions']} callers took the future's slow path to wait again"
    assert report["slowest"] < 10, report


def test_a_calls_future_waits_on_the_os_lock_after_patching() -> None:
    """A future's own lock, which an OS thread waits on and the model's
    thread releases, is the OS's lock after ``monkey.patch_all()``, not
    gevent's (a Python object that cost a served request more to make and
    take than the rest of its future), made before and after patching alike."""
    script = (
        "from gevent import monkey; monkey.patch_all()\n"
        "import threading\n"
        "from streamer_core.future import BatchFuture\n"
        "original = type(monkey.get_original('_thread', 'allocate_lock')())\n"
        "made = type(BatchFuture()._finished)\n"
        "assert type(threading.Lock()) is not original, 'threading is not patched'\n"
        "assert made is original, made\n"
        "f = BatchFuture(); f._finished.release(); print('ok')\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr
