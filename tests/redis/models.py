"""Models and small programs for the Redis tests.

Worker processes (spawned by ``run_redis_workers_forever``, or started as
``python -m tests.redis.models '<json>'``) import these by name, so they live
at module level here rather than inside the tests. Nothing here imports
numpy, so worker processes start quickly.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List

from streamer_core import ManagedModel
from tests.core.models import (  # noqa: F401  (shared with the core tests)
    BrokenInitModel,
    EnvModel,
    ProgressBarModel,
    double,
    fail_on_negative,
    kill_self_on_poison,
    one_short,
)


def identity(batch: List[Any]) -> List[Any]:
    return list(batch)


class OddError(Exception):
    """An exception type the web side has no class for."""


def raise_odd(batch: List[Any]) -> List[Any]:
    raise OddError("the model is odd today")


def with_pid(batch: List[Any]) -> List[Any]:
    return [[x, os.getpid()] for x in batch]


def with_batch(batch: List[Any]) -> List[Any]:
    """Each input with the whole batch it ran in."""
    return [[x, list(batch)] for x in batch]


def pid_unless_exit(batch: List[Any]) -> List[Any]:
    """Ends its process with exit status 3 on a batch holding "exit" (a
    model's own ``os._exit``, its code the one a worker whose model cannot
    load exits with); else each input with the worker's pid."""
    if "exit" in batch:
        os._exit(3)
    return [[x, os.getpid()] for x in batch]


def pid_unless_hang(batch: List[Any]) -> List[Any]:
    """Never returns from a batch holding "hang" (a deadlock); else each
    input with the worker's pid."""
    if "hang" in batch:
        threading.Event().wait()
    return [[x, os.getpid()] for x in batch]


def text_cost(text: Any) -> int:
    """An item_cost: a text's length."""
    return len(text)


class HoldModel(ManagedModel):
    """While the file ``hold`` exists in ``folder``, a batch announces itself
    (file ``inside-<pid>``, holding the batch) and waits, so a test can kill
    or stop a worker mid-batch. Returns each input doubled."""

    def init_model(self, folder: str) -> None:
        self.folder = Path(folder)

    def predict(self, batch: List[Any]) -> List[Any]:
        if (self.folder / "hold").exists():
            # Written whole, then named: a test that sees the file reads it all.
            partial = self.folder / f".partial-{os.getpid()}"
            partial.write_text(json.dumps(batch))
            os.replace(partial, self.folder / f"inside-{os.getpid()}")
            deadline = time.monotonic() + 15
            while (self.folder / "hold").exists() and time.monotonic() < deadline:
                time.sleep(0.005)
        return [x * 2 for x in batch]


class RecordModel(ManagedModel):
    """Appends every input it runs to ``folder/<pid>.jsonl`` and answers with
    the input and its pid, so a test can count what each worker ran."""

    def init_model(self, folder: str, delay: float = 0.0) -> None:
        self.log = Path(folder) / f"{os.getpid()}.jsonl"
        self.delay = delay

    def predict(self, batch: List[Any]) -> List[Any]:
        time.sleep(self.delay)
        with self.log.open("a") as f:
            f.write("".join(json.dumps(x) + "\n" for x in batch))
        return [{"x": x, "pid": os.getpid()} for x in batch]


@dataclass(frozen=True)
class Point:
    """An arbitrary object: only the pickle codec carries it."""

    x: int
    y: int


class Evil:
    """A payload whose unpickling runs code: it creates the directory ``path``."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self) -> Any:
        return (os.mkdir, (self.path,))


# -- programs run as ``python -m tests.redis.models '<json>'`` --------------------------


def _web(spec: Dict[str, Any]) -> int:
    """A web process: ``threads`` callers each make ``calls`` calls of 1 to 3
    inputs and check every answer; prints a JSON summary on stdout."""
    from streamer_core import RedisStreamer

    name, calls = spec["name"], spec["calls"]
    streamer = RedisStreamer(spec["url"], spec["prefix"], timeout=30)
    report: Dict[str, Any] = {"answered": 0, "problems": [], "pids": [], "sent": []}
    lock = threading.Lock()

    def caller(t: int) -> None:
        pids, sent = set(), []
        for i in range(calls):
            inputs = [f"{name}-{t}-{i}-{j}" for j in range(1 + i % 3)]
            try:
                answers = streamer.predict(inputs)
            except Exception as exc:  # reported, not raised: the test says what went wrong
                with lock:
                    report["problems"].append(f"{inputs}: {exc!r}")
                continue
            if [a["x"] for a in answers] != inputs:
                with lock:
                    report["problems"].append(f"{inputs} answered with {answers}")
            pids.update(a["pid"] for a in answers)
            sent.extend(inputs)
        with lock:
            report["answered"] += len(sent)
            report["pids"] = sorted(set(report["pids"]) | pids)
            report["sent"].extend(sent)

    threads = [threading.Thread(target=caller, args=(t,)) for t in range(spec["threads"])]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    streamer.close()
    print(json.dumps(report), flush=True)
    return 0


def _daemon(spec: Dict[str, Any]) -> int:
    """As service_streamer's own tests do: run the workers on a daemon
    thread, and end the program (here, once the file ``end`` appears)."""
    from streamer_core import run_redis_workers_forever

    model = getattr(sys.modules[__name__], spec.pop("model"))
    end = Path(spec.pop("end"))
    threading.Thread(target=run_redis_workers_forever, args=(model,), kwargs=spec, daemon=True).start()
    while not end.exists():
        time.sleep(0.02)
    print("the program ends", flush=True)
    return 0


def _main(argv: List[str]) -> int:
    spec = json.loads(argv[1])
    mode = spec.pop("mode")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s[%(process)d] %(levelname)s %(message)s")
    if mode == "web":
        return _web(spec)
    if mode == "daemon":
        return _daemon(spec)
    from streamer_core import RedisWorker, run_redis_workers_forever

    model = getattr(sys.modules[__name__], spec.pop("model"))
    if mode == "worker":
        RedisWorker(model, **spec).run_forever()
        return 0
    if mode == "supervise":
        return run_redis_workers_forever(model, **spec)
    raise SystemExit(f"unknown mode {mode!r}")


if __name__ == "__main__":
    # Run through the importable name, so spawned worker processes find the
    # models as tests.redis.models (not __main__).
    from tests.redis import models as _models

    sys.exit(_models._main(sys.argv))


class GatedLoadModel(ManagedModel):
    """Loads until the file ``go`` exists in ``folder`` (at most 30 s), as a
    model whose weights take a while; then answers each input doubled."""

    def init_model(self, folder: str) -> None:
        deadline = time.monotonic() + 30
        while not (Path(folder) / "go").exists() and time.monotonic() < deadline:
            time.sleep(0.02)

    def predict(self, batch: List[Any]) -> List[Any]:
        return [x * 2 for x in batch]
