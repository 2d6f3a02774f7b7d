"""Under gevent's ``monkey.patch_all()`` the thread backend's model thread is
a greenlet: a model call that computes must run off the hub, or the whole
server stops for its duration (gunicorn's gevent workers patch everything)."""

from __future__ import annotations

import json
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
