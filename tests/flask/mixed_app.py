"""An app of two models for the metrics of several web processes: ``marked``
on the thread backend (a worker in each web process, as in
:mod:`tests.flask.warm_app`: it leaves ``built-<pid>`` in ``$MARK_FOLDER``),
and ``remote`` on the Redis backend (``$MIXED_REDIS_URL``, prefix
``$MIXED_PREFIX``), whose workers run elsewhere and are the same for every
web process."""

from __future__ import annotations

import os

from flask import Flask

from flask_streamer import FlaskStreamer
from tests.flask.warm_app import MarkedModel
from tests.redis.models import double


def create_app() -> Flask:
    app = Flask(__name__)
    app.config.from_prefixed_env()  # FLASK_STREAMER_METRICS_ROUTE, ...
    streamer = FlaskStreamer()
    streamer.add_batched_route("/marked", "marked", MarkedModel, init_kwargs={"folder": os.environ["MARK_FOLDER"]})
    streamer.add_batched_route(
        "/remote", "remote", double, backend="redis", redis_url=os.environ["MIXED_REDIS_URL"],
        prefix=os.environ["MIXED_PREFIX"],
    )  # fmt: skip
    streamer.init_app(app)
    return app
