"""A streamer made before the server forks its workers (a module-level
streamer under gunicorn ``--preload``, or uWSGI's default of loading the app
once and forking): each forked process starts its own threads and workers
on first use, and its exit leaves the parent's alone."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, Tuple

import pytest

SCRIPT = Path(__file__).with_name("scripts") / "forked_streamer.py"

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="fork() is POSIX")


def run(kind: str, action: str, *redis: str) -> Tuple[Dict[str, Any], str]:
    """Run the script; its report and its standard error."""
    done = subprocess.run(
        [sys.executable, str(SCRIPT), kind, action, *redis],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=Path(__file__).parents[2],
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1]), done.stderr


@pytest.mark.parametrize("kind", ["thread", "process"])
def test_a_streamer_made_before_a_fork_serves_in_the_forked_process(kind):
    report, stderr = run(kind, "call")
    child = report["child"]
    assert child.get("answer") == [42], child
    assert child["seconds"] < 5, "the forked process waited on threads that are not there"
    assert "forked from it" in stderr, "the restart in the forked process should be logged"
    if kind == "process":
        assert child["pids"] and not set(child["pids"]) & set(report["parent_pids"]), "it needs workers of its own"
    assert report["before"] == [2] and report["after"] == [6]


def test_a_process_forked_from_a_forked_one_serves_too():
    report, _ = run("thread", "call-in-grandchild")
    assert report["child"].get("answer") == [42], report["child"]
    assert report["after"] == [6]


@pytest.mark.parametrize("lock", ["stats", "futures", "unavailable"])
def test_a_fork_while_a_thread_holds_a_lock_does_not_stop_the_forked_process(lock):
    """A lock held by another thread at the fork (counting a batch, handing
    out its results, logging a 503) would stay held in the forked process:
    such locks are made again there."""
    report, _ = run("thread", f"call-holding-{lock}")
    assert report["child"].get("answer") == [42], report["child"]
    if lock == "unavailable":
        assert report["child"].get("logged") is True, report["child"]
    assert report["after"] == [6]


def test_a_forked_process_exiting_leaves_the_parents_workers_alone():
    """Its exit runs atexit: neither the streamer's finalizer nor
    multiprocessing's cleanup may stop the workers, which are the parent's."""
    report, stderr = run("process", "call")
    assert report["child_exit"] == 0
    assert report["parent_pids_after"] == report["parent_pids"], "the parent's worker was stopped by the child"
    assert "Traceback" not in stderr, stderr
    assert "restarting" not in stderr, stderr


def test_closing_a_streamer_in_a_forked_process_starts_nothing_there():
    report, stderr = run("process", "close")
    child = report["child"]
    assert child.get("closed") is True and child["live"] == 0, child
    assert child.get("after_close") == "StreamerClosedError", child
    assert child["seconds"] < 2, "close() in a forked process started workers to stop them"
    assert "forked from it" not in stderr, "close() alone must not start the streamer again"
    assert report["parent_pids_after"] == report["parent_pids"] and report["after"] == [6]
