"""A batched route behind a login (docs/flask.md), run by tests/test_docs.py."""

# ruff: noqa: E402, I001  (imports as the docs show them)

from flask import Flask
from flask_httpauth import HTTPTokenAuth
from flask_streamer import FlaskStreamer


class _Lengths:
    def predict(self, batch):
        return [len(text) for text in batch]


model = _Lengths()
app = Flask(__name__)
streamer = FlaskStreamer(app)

# --8<-- [start:auth]
auth = HTTPTokenAuth(scheme="Bearer")  # flask-httpauth


@streamer.batched_route("/stream", decorators=[auth.login_required])
def stream(batch):
    return model.predict(batch)


# --8<-- [end:auth]


@auth.verify_token
def verify_token(token):
    return "reader" if token == "secret" else None
