"""OpenAI's embeddings API on both examples, driven by the real ``openai``
package against a live server on 127.0.0.1 (gunicorn, as the examples
deploy), as a user points ``openai.OpenAI(base_url=...)`` at it.

The same text gives the same numbers through ``/v1/embeddings`` (as floats
or as base64) and ``/stream``, and through its token ids; errors come as
the SDK raises them for the hosted API."""

from __future__ import annotations

import base64
import importlib.util
import json
import os
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional

import numpy as np
import pytest

if importlib.util.find_spec("openai") is None or importlib.util.find_spec("sentence_transformers") is None:
    pytest.skip("needs the openai package and the example's model (the 'test' extra)", allow_module_level=True)

import openai  # noqa: E402

from tests.helpers import wait_for  # noqa: E402
from tests.servers import free_port, kill_group  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
MODEL = "all-MiniLM-L6-v2"
TEXTS = [f"Sentence number {n} is about {topic}." for n, topic in enumerate(["cats", "rain", "code", "tea"] * 25)]


class Example:
    """An example served by gunicorn with its own gunicorn.conf.py."""

    def __init__(self, name: str, folder: Path) -> None:
        self.port = free_port()
        app = "example_flask:create_app()" if name == "flask" else "example_django.wsgi"
        argv = [sys.executable, "-m", "gunicorn", "-c", f"example_{name}/gunicorn.conf.py", "--bind",
                f"127.0.0.1:{self.port}", app]  # fmt: skip
        # As a newcomer runs it: no settings module named but the project's own (wsgi.py names it).
        unset = ("FLASK_", "STREAMER_", "DJANGO_SETTINGS_MODULE")
        env = {key: value for key, value in os.environ.items() if not key.startswith(unset)}
        env.update(PYTHONPATH=str(ROOT), PYTHONUNBUFFERED="1", PIN_WORKERS="0")
        # The numbers of one text are compared across routes and batches to
        # 1e-6: float32's. In bfloat16 (the default on a CPU with AMX or AVX512-BF16) a
        # vector moves by up to ~1e-3 with its batch's padding.
        env.update(FLASK_EMBEDDING_PRECISION="float32", EMBEDDING_PRECISION="float32")
        self.log = folder / f"{name}.log"
        self.client = openai.OpenAI(base_url=f"http://127.0.0.1:{self.port}/v1", api_key="unused", max_retries=0)
        with open(self.log, "wb") as out:  # the last step: nothing after it can leave the server unstopped
            self.process = subprocess.Popen(
                argv, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )

    def ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/readyz", timeout=5) as response:
                return bool(response.status == 200)
        except OSError:
            return False

    def stream(self, text: str) -> np.ndarray:
        request = urllib.request.Request(
            f"http://127.0.0.1:{self.port}/stream",
            json.dumps({"s": text}).encode(),
            {"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=30) as response:
            return np.array(json.loads(response.read()), dtype=np.float32)

    def stop(self) -> None:
        kill_group(self.process)


@pytest.fixture(scope="module", params=["flask", "django"])
def example(request: Any, tmp_path_factory: Any) -> Iterator[Example]:
    served = Example(request.param, tmp_path_factory.mktemp(request.param))
    try:
        assert wait_for(served.ready, 120, interval=0.2), served.log.read_text()[-3000:]
        yield served
    finally:
        served.stop()


def vectors(response: Any) -> List[np.ndarray]:
    assert [item.index for item in response.data] == list(range(len(response.data)))
    return [np.array(item.embedding, dtype=np.float32) for item in response.data]


def test_one_text_as_floats_and_as_base64_is_what_stream_gives(example: Example) -> None:
    floats = example.client.embeddings.create(model=MODEL, input=TEXTS[0], encoding_format="float")
    packed = example.client.embeddings.create(model=MODEL, input=TEXTS[0])  # the SDK asks for base64
    [as_floats], [as_base64] = vectors(floats), vectors(packed)
    expected = example.stream(TEXTS[0])
    assert as_floats.shape == (384,) and np.abs(as_floats - expected).max() < 1e-6
    assert np.abs(as_base64 - expected).max() < 1e-6
    assert floats.model == MODEL and floats.object == "list" and floats.data[0].object == "embedding"


def test_a_hundred_texts_in_one_request_come_back_in_order(example: Example) -> None:
    response = example.client.embeddings.create(model=MODEL, input=TEXTS, encoding_format="float")
    got = vectors(response)
    assert len(got) == 100
    for n in (0, 37, 99):
        assert np.abs(got[n] - example.stream(TEXTS[n])).max() < 1e-6, n
    assert response.usage.prompt_tokens == response.usage.total_tokens > 100 * 5


def test_token_ids_are_the_text_they_spell(example: Example) -> None:
    """The model's own tokenizer's ids, without its special tokens (as
    OpenAI's are): the same vector as the text, and usage counts the tokens
    read, the special ones included."""
    from transformers import AutoTokenizer

    from example_models.embedding import resolve_model

    tokenizer = AutoTokenizer.from_pretrained(resolve_model(MODEL))
    ids = [tokenizer(text, add_special_tokens=False)["input_ids"] for text in TEXTS[:3]]
    one = example.client.embeddings.create(model=MODEL, input=ids[0], encoding_format="float")
    many = example.client.embeddings.create(model=MODEL, input=ids, encoding_format="float")
    expected = [example.stream(text) for text in TEXTS[:3]]
    assert np.abs(vectors(one)[0] - expected[0]).max() < 1e-6
    assert all(np.abs(got - want).max() < 1e-6 for got, want in zip(vectors(many), expected))
    assert many.usage.prompt_tokens == sum(len(each) + 2 for each in ids)


def test_errors_come_as_the_sdk_raises_them(example: Example) -> None:
    client = example.client
    with pytest.raises(openai.BadRequestError) as empty:
        client.embeddings.create(model=MODEL, input=[])
    assert "must not be empty" in str(empty.value)
    with pytest.raises(openai.BadRequestError) as too_many:
        client.embeddings.create(model=MODEL, input=["a"] * 2049)
    assert "at most 2048" in str(too_many.value)
    with pytest.raises(openai.NotFoundError) as unknown:
        client.embeddings.create(model="text-embedding-3-small", input="hello")
    assert unknown.value.code == "model_not_found"
    with pytest.raises(openai.BadRequestError) as dimensions:
        client.embeddings.create(model=MODEL, input="hello", dimensions=100)
    assert "dimensions" in str(dimensions.value)
    assert len(vectors(client.embeddings.create(model=MODEL, input="hello", dimensions=384))[0]) == 384
    with pytest.raises(openai.BadRequestError) as wrong_token:
        client.embeddings.create(model=MODEL, input=[[1, 2], [99_999_999]])
    assert "input 1" in str(wrong_token.value) and "token id 99999999" in str(wrong_token.value)
    assert wrong_token.value.param == "input[1]", "the input refused, as OpenAI's param names it"


def test_the_model_is_listed(example: Example) -> None:
    assert [model.id for model in example.client.models.list()] == [MODEL]


def _raw(example: Example, body: Dict[str, Any], headers: Optional[Dict[str, str]] = None) -> Any:
    request = urllib.request.Request(
        f"http://127.0.0.1:{example.port}/v1/embeddings",
        json.dumps(body).encode(),
        {"Content-Type": "application/json", **(headers or {})},
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def _call(example: Example, method: str, path: str, data: bytes, content_type: str) -> Any:
    request = urllib.request.Request(
        f"http://127.0.0.1:{example.port}{path}", data or None, {"Content-Type": content_type}, method=method
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, response.headers, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers, json.loads(exc.read())


def test_other_methods_and_body_types_are_refused_in_openais_shape(example: Example) -> None:
    """Every answer of the API's routes is in OpenAI's shape, the web
    layer's 405 and 415 too; the 415 asks for JSON, not a form the route
    would then refuse."""
    for method, path, allowed in [("GET", "/v1/embeddings", "POST"), ("POST", "/v1/models", "GET"),
                                  ("DELETE", "/v1/models", "GET")]:  # fmt: skip
        status, headers, body = _call(example, method, path, b"{}" if method == "POST" else b"", "application/json")
        assert status == 405 and headers["Allow"] == allowed, (method, path, status, body)
        assert set(body["error"]) == {"message", "type", "param", "code"}, body
        assert body["error"]["type"] == "invalid_request_error" and f"use {allowed}" in body["error"]["message"]
    status, _, body = _call(example, "POST", "/v1/embeddings", b"input=hello", "text/plain")
    assert status == 415 and set(body["error"]) == {"message", "type", "param", "code"}, body
    assert body["error"]["message"].endswith("send JSON (Content-Type: application/json)"), body


def test_the_wire_format_is_openais(example: Example) -> None:
    """base64 is each vector's little-endian float32 bytes; an error is
    {"error": {"message", "type", "param", "code"}}."""
    status, body = _raw(example, {"model": MODEL, "input": ["hello"], "encoding_format": "base64"})
    assert status == 200
    decoded = np.frombuffer(base64.b64decode(body["data"][0]["embedding"]), dtype="<f4")
    assert decoded.shape == (384,) and abs(float(np.linalg.norm(decoded)) - 1.0) < 1e-5
    status, body = _raw(example, {"model": MODEL, "input": ["hello"]})  # no encoding_format: OpenAI's default
    assert status == 200 and len(body["data"][0]["embedding"]) == 384
    assert all(isinstance(x, float) for x in body["data"][0]["embedding"]), "floats unless base64 is asked for"
    status, body = _raw(example, {"model": MODEL, "input": "hi", "encoding_format": "int8"})
    assert status == 400 and set(body["error"]) == {"message", "type", "param", "code"}
    assert body["error"]["type"] == "invalid_request_error" and body["error"]["param"] == "encoding_format"


def test_the_clients_deadline_header_is_read_as_a_batched_routes(example: Example) -> None:
    """``X-Request-Timeout``, as the examples' batched routes read it: a
    malformed one a 400 in OpenAI's shape; a wait no model call can meet a
    504 (a text embeds in far more than a microsecond)."""
    body = {"model": MODEL, "input": ["hello"]}
    status, answer = _raw(example, body, {"X-Request-Timeout": "soon"})
    assert status == 400 and answer["error"]["type"] == "invalid_request_error", answer
    assert "X-Request-Timeout header must be a number of seconds" in answer["error"]["message"]
    status, answer = _raw(example, body, {"X-Request-Timeout": "0.000001"})
    assert status == 504 and answer["error"]["type"] == "server_error", answer
    assert "within its timeout of 1e-06s" in answer["error"]["message"]
    assert _raw(example, body, {"X-Request-Timeout": "30"})[0] == 200


def test_as_many_inputs_as_the_limit_are_taken_and_one_more_refused() -> None:
    from example_models.openai_api import MAX_INPUTS, ApiError, EmbeddingsRequest

    assert MAX_INPUTS == 2048  # OpenAI's own limit, as the README says
    taken = EmbeddingsRequest.parse({"model": MODEL, "input": ["a"] * MAX_INPUTS}, [MODEL])
    assert len(taken.inputs) == MAX_INPUTS
    assert len(EmbeddingsRequest.parse({"model": MODEL, "input": [[7]] * 3}, [MODEL], max_inputs=3).inputs) == 3
    for booleans in ([True, 5], [[5, False]]):  # JSON's true is not token id 1
        with pytest.raises(ApiError, match=r"'input\[0\]' must be a non-empty string or a non-empty list of token"):
            EmbeddingsRequest.parse({"model": MODEL, "input": booleans}, [MODEL])
    for negative in ([[5, -1]], [-1, 5]):  # a list of lists of ids, and one list of ids
        with pytest.raises(ApiError, match=r"'input\[0\]' holds the token id -1; token ids start at 0"):
            EmbeddingsRequest.parse({"model": MODEL, "input": negative}, [MODEL])
    with pytest.raises(ApiError, match="holds 4 items; at most 3") as refused:
        EmbeddingsRequest.parse({"model": MODEL, "input": ["a"] * 4}, [MODEL], max_inputs=3)
    assert refused.value.status == 400 and refused.value.param == "input"


def test_a_full_queue_is_a_503_with_retry_after_and_a_timeout_a_504_without(closing: Any, gate: Any) -> None:
    """What the route answers when the engine refuses: OpenAI's shape, and
    the ``Retry-After`` a client's retry waits for on a 503 only."""
    import logging

    from example_models.openai_api import serve_embeddings
    from streamer_core import ThreadedStreamer
    from streamer_core.web.http import RETRY_AFTER_FULL, check_body_size

    streamer = closing(ThreadedStreamer(gate, batch_size=8, max_latency=0.01, max_queue=2))
    running = streamer.submit(["hold"])
    assert gate.entered.wait(5)
    log = logging.getLogger("tests.openai")
    body = {"model": MODEL, "input": ["one", "two", "three"]}  # more than the queue holds
    status, answer, headers = serve_embeddings(lambda: body, lambda: streamer, [MODEL], log)
    assert status == 503 and headers == {"Retry-After": str(RETRY_AFTER_FULL)}
    assert answer["error"]["type"] == "server_error" and "max_queue is 2" in answer["error"]["message"]
    late = closing(ThreadedStreamer(gate, batch_size=8, max_latency=0.01, max_queue=2, timeout=0.2))
    held = late.submit(["hold"], timeout=10)  # its model busy until the gate opens
    status, answer, headers = serve_embeddings(lambda: {"model": MODEL, "input": "x"}, lambda: late, [MODEL], log)
    assert status == 504 and headers == {} and answer["error"]["type"] == "server_error"
    gate.release()
    assert running.result(5) == ["ok:hold"] and held.result(5) == ["ok:hold"]
    # A body over the limit, as the web layer's reader refuses it: a 413, in OpenAI's shape too.
    status, answer, headers = serve_embeddings(lambda: check_body_size(11, 10), lambda: late, [MODEL], log)
    assert status == 413 and headers == {} and set(answer["error"]) == {"message", "type", "param", "code"}
    assert answer["error"]["type"] == "invalid_request_error" and "more than the 10" in answer["error"]["message"]


def test_a_model_that_is_not_a_string_is_told_so_not_that_it_is_missing() -> None:
    from example_models.openai_api import ApiError, EmbeddingsRequest

    for missing in ({"input": "a"}, {"model": "", "input": "a"}):
        with pytest.raises(ApiError, match="you must give 'model'"):
            EmbeddingsRequest.parse(missing, [MODEL])
    with pytest.raises(ApiError, match="'model' must be a string, the name of the model to use, not 5") as wrong:
        EmbeddingsRequest.parse({"model": 5, "input": "a"}, [MODEL])
    assert wrong.value.status == 400 and wrong.value.param == "model"


@pytest.mark.parametrize("details", [False, True])
def test_a_500_says_internal_error_and_an_id_unless_the_app_is_in_debug_mode(
    closing: Any, caplog: Any, details: bool
) -> None:
    """A model that fails: OpenAI's shape of a server error, ``internal
    error`` and the id of the log line that carries the traceback; the
    exception itself only in the app's debug mode."""
    import logging

    from example_models.openai_api import serve_embeddings
    from streamer_core import ThreadedStreamer

    def broken(batch: List[Any]) -> List[Any]:
        raise RuntimeError("the weights at /secret/path are gone")

    streamer = closing(ThreadedStreamer(broken, batch_size=8, max_latency=0.01))
    log = logging.getLogger("tests.openai")
    request = {"model": MODEL, "input": ["one", "two"]}
    with caplog.at_level(logging.ERROR, "tests.openai"):
        status, answer, _ = serve_embeddings(lambda: request, lambda: streamer, [MODEL], log, details)
    error = answer["error"]
    assert status == 500 and error["type"] == "server_error" and len(error["id"]) == 16
    said = "the weights at /secret/path are gone" if details else "internal error"
    assert error["message"] == f"input 0: {said}"
    (line,) = [record for record in caplog.records if error["id"] in record.getMessage()]
    assert line.exc_info is not None and "/secret/path" in str(line.exc_info[1])
