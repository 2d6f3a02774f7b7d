"""Priority levels from a Flask app (docs/behaviour.md), run by tests/test_docs.py."""

# ruff: noqa: E402, I001  (imports as the docs show them)

from flask import Flask
from flask_streamer import FlaskStreamer


class _Lengths:
    def encode(self, batch):
        return [len(text) for text in batch]


model = _Lengths()
app = Flask(__name__)
# --8<-- [start:flask]
app.config["STREAMER_PRIORITY_LEVELS"] = 2
# --8<-- [end:flask]
streamer = FlaskStreamer(app)


# --8<-- [start:routes]
@streamer.batched_route("/search", priority=1)  # a search box: served first
def embed(batch):
    return model.encode(batch)


# the re-index, on the same model and queue, at level 2; its callers may raise a request with X-Priority: 1
streamer.add_batched_route("/reindex", "reindex", model="embed", priority=2, priority_header=True, many=True)
# --8<-- [end:routes]
