"""The Flask quickstart (README.md, docs/flask.md), run by tests/test_docs.py."""

# ruff: noqa: E402, I001  (imports as the docs show them)

# --8<-- [start:app]
from flask import Flask
from flask_streamer import FlaskStreamer

app = Flask(__name__)
app.config["STREAMER_BACKEND"] = "thread"  # "thread" | "process" | "redis"
streamer = FlaskStreamer(app)  # or FlaskStreamer() + streamer.init_app(app)


@streamer.batched_route("/stream", methods=["POST"], batch_size=64, max_latency=0.05, field="s")
def stream(batch):  # a list of inputs -> a list of outputs
    return model.predict(batch)


# --8<-- [end:app]


class _Lengths:
    """A model small enough for a test: each text's length."""

    def predict(self, batch):
        return [len(text) for text in batch]


model = _Lengths()
