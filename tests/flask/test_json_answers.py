"""What a batched route answers: NumPy arrays and tensors written as they
are (orjson, where it is installed), read back to the same float32 values;
an app's own JSON provider respected; bodies no JSON reader should choke on
refused with a JSON 400."""

from __future__ import annotations

import json
from typing import Any, Callable, List, Tuple

import numpy as np
import pytest
from flask import Flask
from flask.json.provider import DefaultJSONProvider

from flask_streamer import FlaskStreamer
from tests.flask.conftest import error_of
from tests.helpers import failure_behind

torch = pytest.importorskip("torch")


def embeddings(batch: List[Any]) -> Any:
    """A (len(batch), n) float32 array, as sentence-transformers answers."""
    n = int(batch[0])
    return np.stack([np.linspace(0.1, 1.0, n, dtype=np.float32) / (i + 3) for i in range(len(batch))])


def tensors(batch: List[Any]) -> Any:
    return [torch.tensor([float(x), 0.5], requires_grad=True) for x in batch]


def test_array_and_tensor_outputs_are_answered_as_their_values(
    make_app: Callable[..., Tuple[Flask, FlaskStreamer]],
) -> None:
    app, streamer = make_app()
    streamer.add_batched_route("/embed", "embed", embeddings, field="n")
    streamer.add_batched_route("/tensor", "tensor", tensors)
    client = app.test_client()
    response = client.post("/embed", json={"n": 384})
    assert response.status_code == 200 and response.mimetype == "application/json"
    expected = embeddings([384])[0]
    assert np.array_equal(np.asarray(response.get_json(), dtype=np.float32), expected)
    assert client.post("/tensor", json=2).get_json() == [2.0, 0.5]


def test_an_apps_own_json_provider_is_used(make_app: Callable[..., Tuple[Flask, FlaskStreamer]]) -> None:
    class Tagged(DefaultJSONProvider):
        def loads(self, s: Any, **kwargs: Any) -> Any:
            value = json.loads(s)
            return {"n": value["n"] + 1} if isinstance(value, dict) else value

        def response(self, *args: Any, **kwargs: Any) -> Any:
            answer = super().response(*args, **kwargs)
            answer.headers["X-Provider"] = "tagged"
            return answer

    app, streamer = make_app()
    app.json = Tagged(app)
    streamer.add_batched_route("/embed", "embed", embeddings, field="n")
    response = app.test_client().post("/embed", json={"n": 3})
    assert response.headers["X-Provider"] == "tagged"
    assert len(response.get_json()) == 4  # the provider read the body too


def test_a_body_nested_too_deep_is_a_json_400(make_app: Callable[..., Tuple[Flask, FlaskStreamer]]) -> None:
    app, streamer = make_app()
    streamer.add_batched_route("/embed", "embed", embeddings, field="n")
    streamer.add_batched_route("/whole", "whole", lambda batch: batch)
    deep = "[" * 100_000 + "]" * 100_000
    for path in ("/embed", "/whole"):
        error = error_of(app.test_client().post(path, data=deep, content_type="application/json"), 400)
        assert "not valid JSON" in error["message"]


def test_an_output_with_no_json_form_is_a_json_500(
    make_app: Callable[..., Tuple[Flask, FlaskStreamer]], caplog: pytest.LogCaptureFixture
) -> None:
    app, streamer = make_app()
    streamer.add_batched_route("/sets", "sets", lambda batch: [{1, 2} for _ in batch])
    failure = failure_behind(error_of(app.test_client().post("/sets", json=1), 500), caplog.records)
    assert type(failure).__name__ == "SerializationError" and "cannot be sent as JSON" in str(failure)
