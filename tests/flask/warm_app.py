"""An app for the warm-up tests: its model leaves ``built-<pid>`` in
``$MARK_FOLDER`` when it is built, and answers each input with its pid."""

from __future__ import annotations

import gc
import os
import sys
from pathlib import Path
from typing import Any, List

from flask import Flask, request

from flask_streamer import FlaskStreamer
from streamer_core import ManagedModel


class MarkedModel(ManagedModel):
    def init_model(self, folder: str) -> None:
        Path(folder, f"built-{os.getpid()}").write_text("")

    def predict(self, batch: List[Any]) -> List[Any]:
        return [[x, os.getpid()] for x in batch]


def _named(function: Any) -> str:
    return f"{function.__module__}.{function.__qualname__}"


def _serving_handler() -> Any:
    """The class of the server's handler serving this request: the caller's
    ``self`` that has ``log_request`` (None under a server without one)."""
    frame = sys._getframe()
    while frame is not None and not hasattr(frame.f_locals.get("self"), "log_request"):
        frame = frame.f_back  # type: ignore[assignment]
    return None if frame is None else type(frame.f_locals["self"])


def create_app() -> Flask:
    app = Flask(__name__)
    app.config.from_prefixed_env()  # FLASK_STREAMER_TIMEOUT, ...
    streamer = FlaskStreamer()
    streamer.add_batched_route("/marked", "marked", MarkedModel, init_kwargs={"folder": os.environ["MARK_FOLDER"]})
    streamer.init_app(app)

    @app.get("/process")
    def process() -> Any:
        """What the server's hooks made of this process: its frozen objects,
        the collector's thresholds, its cores, and the class of the server's
        handler serving this request (the caller that has ``log_request``),
        with the functions it logs a request and sends a response by."""
        handler = _serving_handler()
        return {
            "frozen": gc.get_freeze_count(),
            "threshold": gc.get_threshold(),
            "cores": sorted(os.sched_getaffinity(0)),
            "handler": None if handler is None else _named(handler),
            "log_request": None if handler is None else _named(handler.log_request),
            "sendall": None if handler is None else _named(handler._sendall),
        }

    @app.post("/headers")
    def headers() -> Any:
        """What the server made of the request's headers: the modules of its
        handler's header and request reading, the environ's header keys and
        others, and the body."""
        handler = _serving_handler()
        reader = None if handler is None else handler.MessageClass.__module__
        request_reader = None if handler is None else handler.read_request.__module__
        keys = [key for key in request.environ if key.startswith("HTTP_")]
        keys += ["CONTENT_TYPE", "CONTENT_LENGTH", "QUERY_STRING", "PATH_INFO", "REQUEST_METHOD", "SCRIPT_NAME"]
        keys += ["SERVER_PROTOCOL", "REMOTE_ADDR", "RAW_URI", "wsgi.input_terminated"]
        environ = {key: request.environ.get(key) for key in keys}
        environ["gunicorn.sock"] = request.environ.get("gunicorn.sock") is not None
        environ["body"] = request.get_data(as_text=True)
        return {"reader": reader, "request_reader": request_reader, "environ": environ}

    return app
