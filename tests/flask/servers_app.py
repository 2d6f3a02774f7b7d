"""The app that the live-server tests run under real servers (the Flask
development server, gunicorn, gevent's WSGIServer).

``create_app()`` serves:

* ``POST /predict``: batched; the model stands for an accelerator: it holds
  its thread (without the GIL and without yielding to gevent) for
  ``MODEL_SLEEP`` seconds per batch, and answers each input ``x`` with
  ``{"x": x, "batch": len(batch), "pid": pid}`` so a client sees how its
  request was batched and which process served it;
* ``POST /slow``: the same with ``SLOW_SLEEP`` seconds per batch, to keep a
  batch in flight while the tests probe the server;
* ``POST /gate`` (with ``GATE_FOLDER`` set): batched, on
  :class:`tests.core.models.RecordingGate` (what reached the model is in
  ``GATE_FOLDER/ran.jsonl``; an input ``"hold"`` waits while
  ``GATE_FOLDER/hold`` exists); ``GET /dropped``: its inputs dropped unrun,
  by reason, in this process; ``GET /outcomes``: its calls by outcome;
* ``GET /ping``: no model; says which process answered, how many batches are
  inside a model right now and how the server runs (gevent, patched or not).

Settings come from ``FLASK_*`` environment variables (``from_prefixed_env``:
``FLASK_STREAMER_BATCH_SIZE=32``, ``FLASK_MODEL_SLEEP=0.02``, ...).

``REQUEST_LOG=<path>`` appends each request's path to that file as the
request enters the app, for tests that count the requests a server took.

``BLOCKING_WAIT=true`` is a control for the tests only: it turns off the
library's gevent-aware wait, so a view waits on a plain lock as
service_streamer's does, which blocks an unpatched gevent server's loop.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any, Dict, List, Optional

from flask import Flask, jsonify, request

from flask_streamer import FlaskStreamer
from streamer_core import ManagedModel

DEFAULTS: Dict[str, Any] = {
    "STREAMER_BACKEND": "thread",
    "STREAMER_BATCH_SIZE": 64,
    "STREAMER_MAX_LATENCY": 0.05,
    "MODEL_SLEEP": 0.02,
    "SLOW_SLEEP": 0.6,
    "BLOCKING_WAIT": False,
    "REQUEST_LOG": None,
    "GATE_FOLDER": None,
}

# Batches inside a model right now, per route. Each route's model runs on one
# thread at a time, so each counter has one writer.
_in_model = {"predict": 0, "slow": 0}


def _hold_thread(seconds: float) -> None:
    """Hold this OS thread as an accelerator call does: without the GIL, and
    without yielding to gevent even when ``time`` is monkey-patched."""
    monkey = sys.modules.get("gevent.monkey")
    sleep = time.sleep
    if monkey is not None and monkey.is_module_patched("time"):
        sleep = monkey.get_original("time", "sleep")
    sleep(seconds)


def _model(name: str, seconds: float):
    def model(batch: List[Any]) -> List[Dict[str, Any]]:
        _in_model[name] += 1
        try:
            _hold_thread(seconds)
        finally:
            _in_model[name] -= 1
        pid = os.getpid()
        return [{"x": x, "batch": len(batch), "pid": pid} for x in batch]

    model.__name__ = name
    return model


class SleepModel(ManagedModel):
    """The same model, built in each worker of the process backend (which
    needs a model it can import by name, not a closure)."""

    def init_model(self, name: str, seconds: float) -> None:
        self._predict = _model(name, seconds)

    def predict(self, batch: List[Any]) -> List[Any]:
        return self._predict(batch)


def _server_mode() -> Dict[str, Any]:
    gevent = sys.modules.get("gevent")
    monkey = sys.modules.get("gevent.monkey")
    patched = monkey is not None and monkey.is_module_patched("threading")
    in_greenlet = gevent is not None and isinstance(gevent.getcurrent(), gevent.Greenlet)
    return {"gevent": gevent is not None, "patched": patched, "greenlet": in_greenlet}


def create_app(config: Optional[Dict[str, Any]] = None) -> Flask:
    app = Flask(__name__)
    app.config.update(DEFAULTS)
    app.config.from_prefixed_env()
    app.config.update(config or {})

    if app.config["BLOCKING_WAIT"]:
        import streamer_core.future

        streamer_core.future.in_greenlet = lambda: False  # type: ignore[assignment]

    streamer = FlaskStreamer()
    for name in ("predict", "slow"):
        seconds = float(app.config["MODEL_SLEEP" if name == "predict" else "SLOW_SLEEP"])
        if app.config["STREAMER_BACKEND"] == "process":
            streamer.add_batched_route(f"/{name}", name, SleepModel, init_kwargs={"name": name, "seconds": seconds})
        else:
            streamer.add_batched_route(f"/{name}", name, _model(name, seconds))
    if app.config["GATE_FOLDER"]:
        from streamer_core.telemetry.stats import stats_for
        from tests.core.models import RecordingGate

        streamer.add_batched_route("/gate", "gate", RecordingGate, init_kwargs={"folder": app.config["GATE_FOLDER"]})

        @app.get("/dropped")
        def dropped() -> Any:
            return jsonify(stats_for("gate").snapshot().dropped)

        @app.get("/outcomes")
        def outcomes() -> Any:
            return jsonify(stats_for("gate").snapshot().requests)

    streamer.init_app(app)

    if app.config["REQUEST_LOG"]:
        log_path = app.config["REQUEST_LOG"]

        @app.before_request
        def log_entry() -> None:
            # One line per request as it enters the app, appended whole
            # (O_APPEND), whichever process serves it.
            fd = os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                os.write(fd, f"{request.path}\n".encode())
            finally:
                os.close(fd)

    @app.get("/ping")
    def ping() -> Any:
        return jsonify(pid=os.getpid(), in_model=dict(_in_model), **_server_mode())

    return app
