"""An app that says what it received, for the tests that send malformed
and ambiguous requests to real servers: ``POST /echo`` is a batched route
whose model answers each input as it came; ``POST /raw`` answers the body
and the lengths the app saw, as werkzeug read them."""

from __future__ import annotations

from typing import Any, List

from flask import Flask, request

from flask_streamer import FlaskStreamer


def echo(batch: List[Any]) -> List[Any]:
    return list(batch)


def create_app() -> Flask:
    app = Flask(__name__)
    app.config.from_prefixed_env()  # FLASK_STREAMER_SHORTCUTS=false, ...
    FlaskStreamer(app).add_batched_route("/echo", "echo", echo, max_body_bytes=1000)

    @app.post("/raw")
    def raw() -> Any:
        return {
            "body": request.get_data(as_text=True),
            "length": request.environ.get("CONTENT_LENGTH"),
            "coding": request.environ.get("HTTP_TRANSFER_ENCODING"),
        }

    return app
