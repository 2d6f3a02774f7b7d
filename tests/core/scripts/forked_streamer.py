"""A streamer made before ``fork()``, as a module-level one is under gunicorn
``--preload`` or uWSGI without ``--lazy-apps``. Run by tests/core/test_fork.py
(a script of its own: pytest's process is no place to fork), which reads
the JSON line it prints last.

    python forked_streamer.py thread|process|redis call|close|call-holding-LOCK [REDIS_URL PREFIX]

``call-holding-stats`` (``-futures``, ``-unavailable``) forks while a
thread of the parent holds the lock of the streamer's numbers (of
completing futures, of the web layers' 503 log lines), as one counting a
batch (handing out its results, logging a 503) would.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
import threading
import time
from typing import Any, Callable, Dict, List

from streamer_core import RedisStreamer, Streamer, StreamerClosedError, ThreadedStreamer, future
from streamer_core.web import http


def double(batch: List[int]) -> List[int]:
    return [x * 2 for x in batch]


def in_child(streamer: Any, action: str) -> Dict[str, Any]:
    if action == "call-in-grandchild":  # forked again before any use: the grandchild calls
        return through_fork(lambda: in_child(streamer, "call"))
    report: Dict[str, Any] = {}
    started = time.monotonic()
    try:
        if action.startswith("call"):
            report["answer"] = streamer.predict([21], timeout=10)
            report["pids"] = streamer.worker_pids() if isinstance(streamer, Streamer) else []
            if action.endswith("unavailable"):
                http.log_unavailable(logging.getLogger("forked"), "the batched route x", 503, RuntimeError("down"))
                report["logged"] = True
        else:
            streamer.close(timeout=5)
            report["closed"], report["live"] = streamer.closed, streamer.live_workers()
            try:
                streamer.predict([1], timeout=2)
            except StreamerClosedError:
                report["after_close"] = "StreamerClosedError"
    except Exception as exc:
        report["error"] = f"{type(exc).__name__}: {exc}"
    report["seconds"] = time.monotonic() - started
    return report


def through_fork(work: Callable[[], Dict[str, Any]]) -> Dict[str, Any]:
    """Fork; the new process runs ``work`` and exits; return its report."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        signal.alarm(30)  # a forked process stuck on a lock dies rather than outlive the test
        os.close(read)
        os.write(write, json.dumps(work()).encode())
        os.close(write)
        sys.exit(0)  # a normal exit, as a server's worker makes: atexit handlers and finalizers run
    os.close(write)
    with os.fdopen(read) as pipe:
        report: Dict[str, Any] = json.loads(pipe.read() or "{}")
    _, status = os.waitpid(pid, 0)
    report["exit"] = os.waitstatus_to_exitcode(status)
    return report


def main(kind: str, action: str, *redis: str) -> None:
    streamer: Any
    if kind == "thread":
        streamer = ThreadedStreamer(double, 8, 0.01)
    elif kind == "process":
        streamer = Streamer(double, 8, 0.01)
    else:
        streamer = RedisStreamer(redis[0], redis[1])
    assert streamer.wait_ready(60)
    report: Dict[str, Any] = {"before": streamer.predict([1], timeout=10)}
    report["parent_pids"] = streamer.worker_pids() if kind == "process" else []
    if action.startswith("call-holding-"):
        held, release = threading.Event(), threading.Event()
        lock = {
            "stats": streamer._stats._lock,
            "futures": future._LAZY_LOCK,
            "unavailable": http._unavailable_lock,
        }[action.rsplit("-", 1)[1]]

        def count() -> None:
            with lock:
                held.set()
                release.wait(10)

        counter = threading.Thread(target=count)
        counter.start()
        held.wait(10)
        report["child"] = through_fork(lambda: in_child(streamer, action))
        release.set()
        counter.join()
    else:
        report["child"] = through_fork(lambda: in_child(streamer, action))
    report["child_exit"] = report["child"].pop("exit")
    time.sleep(0.5)  # a worker killed by the child's exit would be seen dead by now
    report["after"] = streamer.predict([3], timeout=10)
    report["parent_pids_after"] = streamer.worker_pids() if kind == "process" else []
    streamer.close()
    print(json.dumps(report))


if __name__ == "__main__":
    main(*sys.argv[1:])
