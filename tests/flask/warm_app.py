"""An app for the warm-up tests: its model leaves ``built-<pid>`` in
``$MARK_FOLDER`` when it is built, and answers each input with its pid."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, List

from flask import Flask

from flask_streamer import FlaskStreamer
from streamer_core import ManagedModel


class MarkedModel(ManagedModel):
    def init_model(self, folder: str) -> None:
        Path(folder, f"built-{os.getpid()}").write_text("")

    def predict(self, batch: List[Any]) -> List[Any]:
        return [[x, os.getpid()] for x in batch]


def create_app() -> Flask:
    app = Flask(__name__)
    app.config.from_prefixed_env()  # FLASK_STREAMER_TIMEOUT, ...
    streamer = FlaskStreamer()
    streamer.add_batched_route("/marked", "marked", MarkedModel, init_kwargs={"folder": os.environ["MARK_FOLDER"]})
    streamer.init_app(app)
    return app
