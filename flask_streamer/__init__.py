"""flask_streamer: dynamic batching for Flask apps.

    from flask import Flask
    from flask_streamer import FlaskStreamer

    app = Flask(__name__)
    streamer = FlaskStreamer(app)

    @streamer.batched_route("/stream", methods=["POST"], batch_size=64, max_latency=0.05)
    def stream(batch):
        return model.predict(batch)

Settings are read from ``app.config`` (``STREAMER_BACKEND``,
``STREAMER_BATCH_SIZE``, ...; see :mod:`flask_streamer.settings`). Errors
are answered as JSON: 400 for input that cannot be parsed, 500 when the model
raised for this input, 504 on timeout, 503 with ``Retry-After`` when the
queue is full or no worker is available.
"""

from streamer_core.errors import ConfigurationError, InvalidInput

from .extension import (
    BatchedRoute,
    FlaskStreamer,
    json_body,
    json_error,
    request_inputs,
    request_item,
    request_upload,
    start_streamers,
)
from .settings import DEFAULTS

__all__ = [
    "FlaskStreamer",
    "BatchedRoute",
    "InvalidInput",
    "ConfigurationError",
    "DEFAULTS",
    "json_body",
    "json_error",
    "request_item",
    "request_inputs",
    "request_upload",
    "start_streamers",
]
