"""Models and apps for the Flask tests.

Spawned worker processes (the process backend, and the Redis workers that
``flask streamer run-workers`` starts) import the models by name, so they
live at module level here rather than inside the tests. Importing this module
in a worker must start nothing: it makes an app with process-backend routes
(``process_app``) at import, exactly what a real app module does, and its
models report whether that app's streamers were started in their process.
"""

from __future__ import annotations

import multiprocessing
import os
import threading
import time
from typing import Any, Dict, List, Optional

from flask import Flask

from flask_streamer import FlaskStreamer
from streamer_core import ManagedModel


def double(batch: List[Any]) -> List[Any]:
    return [x * 2 for x in batch]


def sized(batch: List[Any]) -> List[Dict[str, Any]]:
    """Each input with the size of the batch it ran in."""
    return [{"x": x, "n": len(batch)} for x in batch]


def with_batch(batch: List[Any]) -> List[Dict[str, Any]]:
    """Each input with the whole batch it ran in."""
    return [{"x": x, "batch": list(batch)} for x in batch]


def text_cost(text: Any) -> int:
    """An ``item_cost``: a text's length; anything but a text cannot be costed."""
    if not isinstance(text, str):
        raise TypeError(f"expected a text, got {type(text).__name__}")
    return len(text)


def fail_on_boom(batch: List[Any]) -> List[str]:
    """Raises for any batch holding ``"boom"``; the other inputs get ``ok:<x>``."""
    if "boom" in batch:
        raise ValueError("the model cannot take 'boom'")
    return [f"ok:{x}" for x in batch]


def _started_here() -> int:
    """How many of ``process_app``'s streamers this process has started."""
    return sum(handle.started for handle in process_app.extensions["streamer"].handles.values())


def where(batch: List[Any]) -> List[Dict[str, Any]]:
    """Which process ran each input, and whether that process started
    streamers or worker processes of its own."""
    return [
        {"x": x, "pid": os.getpid(), "children": len(multiprocessing.active_children()), "started": _started_here()}
        for x in batch
    ]


class DeviceModel(ManagedModel):
    """Reports the device its worker was given, what CUDA would see there,
    and its pid; ``delay`` keeps a worker busy so the other one gets work."""

    def init_model(self, tag: str = "", delay: float = 0.0) -> None:
        self.tag = tag
        self.delay = delay
        self.pause = threading.Event()

    def predict(self, batch: List[Any]) -> List[Dict[str, Any]]:
        self.pause.wait(self.delay)
        return [
            {
                "x": x,
                "pid": os.getpid(),
                "cvd": os.environ.get("CUDA_VISIBLE_DEVICES"),
                "gpu_id": self.gpu_id,
                "tag": self.tag,
                "children": len(multiprocessing.active_children()),
                "started": _started_here(),
            }
            for x in batch
        ]


class BrokenModel(ManagedModel):
    """A model whose weights cannot be found: every worker fails to start."""

    def init_model(self) -> None:
        raise FileNotFoundError("weights.bin not found")

    def predict(self, batch: List[Any]) -> List[Any]:  # pragma: no cover - never reached
        return batch


class GatedModel:
    """A model for the thread backend: records every batch, holds any batch
    with ``"hold"`` in it until :meth:`release`, raises for one holding
    ``"boom"``, and answers ``ok:<x>`` otherwise."""

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.opened = threading.Event()
        self.batches: List[List[Any]] = []
        self._lock = threading.Lock()

    def __call__(self, batch: List[Any]) -> List[str]:
        with self._lock:
            self.batches.append(list(batch))
        if "hold" in batch:
            self.entered.set()
            assert self.opened.wait(30), "the test never released the model"
        return fail_on_boom(batch)

    def release(self) -> None:
        self.opened.set()

    def seen(self) -> List[Any]:
        with self._lock:
            return [x for batch in self.batches for x in batch]


# -- apps ---------------------------------------------------------------------


def hold_while_file(batch: List[Any]) -> List[Any]:
    """Echoes its inputs, but first waits (10 s at most) while the file
    named by ``$HOLD_FILE`` exists: a batch a test can keep in a worker."""
    path = os.environ.get("HOLD_FILE")
    deadline = time.monotonic() + 10
    while path and os.path.exists(path) and time.monotonic() < deadline:
        time.sleep(0.01)
    return list(batch)


def create_redis_app(config: Optional[Dict[str, Any]] = None) -> Flask:
    """An app on the Redis backend with two batched routes, ``double`` and
    ``sized``: defaults, then ``FLASK_*`` environment variables (how
    ``flask --app 'tests.flask.apps:create_redis_app()' streamer run-workers``
    is told the Redis URL and prefix), then ``config``."""
    app = Flask("redis_app")
    app.config.update(STREAMER_BACKEND="redis", STREAMER_BATCH_SIZE=8, STREAMER_MAX_LATENCY=0.01, STREAMER_TIMEOUT=30)
    app.config.from_prefixed_env()
    app.config.update(config or {})
    streamer = FlaskStreamer(app)
    streamer.add_batched_route("/double", model=double)
    streamer.add_batched_route("/sized", model=sized)
    streamer.add_batched_route("/boom", "boom", fail_on_boom)
    if app.config.get("WITH_HOLD_ROUTE"):
        streamer.add_batched_route("/hold", "hold", hold_while_file)
    return app


# An app made at import, as an app module does: its process-backend routes
# must start nothing until their first request, so that importing this module
# in a worker process starts no workers there.
process_app = Flask("process_app")
process_app.config.update(
    STREAMER_BACKEND="process",
    STREAMER_WORKER_NUM=2,
    STREAMER_CUDA_DEVICES=[0, 1],
    STREAMER_BATCH_SIZE=2,
    STREAMER_MAX_LATENCY=0.01,
    STREAMER_TIMEOUT=60,
)
process_streamer = FlaskStreamer(process_app)
process_streamer.add_batched_route("/device", "device", DeviceModel, init_kwargs={"tag": "emb", "delay": 0.05})
process_streamer.add_batched_route("/boom", "boom", fail_on_boom, worker_num=1, cuda_devices=None)


@process_streamer.batched_route("/where", endpoint="where", worker_num=1, cuda_devices=None)
def where_route(batch: List[Any]) -> List[Dict[str, Any]]:
    """The decorated-function form, one worker."""
    return where(batch)
