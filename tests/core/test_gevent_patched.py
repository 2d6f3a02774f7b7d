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
