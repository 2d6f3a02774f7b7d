"""Many inputs in one request (docs/flask.md), run by tests/test_docs.py."""

# ruff: noqa: E402, I001  (imports as the docs show them)

from flask import Flask
from flask_streamer import FlaskStreamer


class _Lengths:
    def predict(self, batch):
        return [len(text) for text in batch]


model = _Lengths()
app = Flask(__name__)
streamer = FlaskStreamer(app)


# --8<-- [start:many]
@streamer.batched_route("/embed", many=True, field="texts", max_inputs=256)
def embed(batch):  # the inputs of every request, mixed, at most batch_size
    return model.predict(batch)


# --8<-- [end:many]
