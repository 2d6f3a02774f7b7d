"""The embeddings API that clients of OpenAI's already speak, on the
example's model: ``POST /v1/embeddings`` and ``GET /v1/models``, as the
OpenAI API documents them, so that ``openai.OpenAI(base_url=...)``,
LangChain's ``OpenAIEmbeddings`` or LlamaIndex's work against the example
as they work against the hosted API.

Framework-free: the Flask and the Django example each call it from a view
of a few lines. A request's inputs (one text, texts, token ids, lists of
token ids: the model's own tokenizer's ids, without its special tokens)
each run as an input of the model's, batched with other requests' and with
``/stream``'s; ``usage`` counts the tokens the model read of them (its
special tokens included). ``encoding_format`` ``"base64"`` (what the
``openai`` package asks for when its caller does not choose) is each
vector's little-endian float32 bytes. ``dimensions`` may only be the
model's own: it has no other. Errors are in OpenAI's shape,
``{"error": {"message", "type", "param", "code"}}``.
"""

from __future__ import annotations

import base64
import calendar
import logging
from typing import Any, Callable, Dict, List, NamedTuple, Optional, Tuple

import numpy as np

from streamer_core import BaseStreamer, BatchFuture, BatchingConfig
from streamer_core.errors import MethodNotAllowed
from streamer_core.web.http import INTERNAL_MESSAGE, error_headers, error_id, status_for

__all__ = [
    "ApiError",
    "EmbeddingsRequest",
    "serve_embeddings",
    "error_reply",
    "method_not_allowed",
    "embeddings_reply",
    "models_reply",
    "MAX_INPUTS",
    "METHODS",
]

#: The most inputs of one request, as OpenAI's API takes.
MAX_INPUTS = 2048
#: The methods a route of this API answers itself, those it does not serve
#: with a 405 in OpenAI's shape (OPTIONS and HEAD are the framework's).
METHODS = ["GET", "POST", "PUT", "PATCH", "DELETE"]
#: When the model is said to have been made (``GET /v1/models``'s ``created``): this example's day.
_CREATED = calendar.timegm((2026, 11, 25, 0, 0, 0))

Reply = Tuple[int, Dict[str, Any], Dict[str, str]]


def serve_embeddings(
    body: Callable[[], Any],
    streamer: Callable[[], BaseStreamer],
    served: List[str],
    log: logging.Logger,
    details: bool = False,
    deadline: Optional[Callable[[BatchingConfig], Optional[float]]] = None,
) -> Reply:
    """Serve one ``POST /v1/embeddings``: ``body()`` reads the request's JSON
    (the framework layer's reader: its body limit, media types), its inputs
    run through ``streamer()`` with other requests', and every failure is
    an error in OpenAI's shape, a 5xx logged to ``log``; a 500 says what
    failed only with ``details`` (the app's debug mode), else ``internal
    error`` and the id its log line carries. ``deadline(config)``: the
    call's timeout from the client's deadline header, as a batched route
    reads it (:mod:`streamer_core.web.deadline`; ``None``: the model's).
    ``(status, body, headers)``."""
    future: Optional[BatchFuture] = None
    try:
        running = streamer()
        timeout = None if deadline is None else deadline(running.config)
        request = EmbeddingsRequest.parse(body(), served)
        future = running.submit(request.inputs, timeout)
        return 200, embeddings_reply(future.result(), request), {}
    except Exception as exc:
        made = error_id() if _status(exc) == 500 else None
        reply = error_reply(exc, future.failed_input if future is not None else None, details, made)
        if reply[0] == 500:
            log.error("POST /v1/embeddings failed (error id %s)", made, exc_info=exc)
        elif reply[0] > 500:
            log.warning("POST /v1/embeddings: %s", exc)
        return reply


class ApiError(Exception):
    """A request the API refuses, as OpenAI words it."""

    def __init__(self, status: int, message: str, param: Optional[str] = None, code: Optional[str] = None) -> None:
        super().__init__(message)
        self.status, self.param, self.code = status, param, code


class EmbeddingsRequest(NamedTuple):
    """A checked ``POST /v1/embeddings`` body: the model's inputs (``{"input":
    text or token ids}`` each), and how to answer."""

    inputs: List[Dict[str, Any]]
    model: str
    encoding_format: str
    dimensions: Optional[int]

    @classmethod
    def parse(cls, body: Any, served: List[str], max_inputs: int = MAX_INPUTS) -> EmbeddingsRequest:
        """Check ``body`` against the API; ``served``: the names the model
        answers to. Raises :class:`ApiError` (400, or 404 for another model)."""
        if not isinstance(body, dict):
            raise ApiError(400, "the body must be a JSON object with 'input' and 'model'")
        model = body.get("model")
        if model is None or model == "":
            raise ApiError(400, "you must give 'model', the name of the model to use", "model")
        if not isinstance(model, str):
            raise ApiError(400, f"'model' must be a string, the name of the model to use, not {model!r}", "model")
        if model not in served:
            raise ApiError(
                404, f"The model '{model}' does not exist: this server serves {served[0]!r}", "model", "model_not_found"
            )
        encoding_format = body.get("encoding_format") or "float"
        if encoding_format not in ("float", "base64"):
            raise ApiError(
                400, f"'{encoding_format}' is not one of ['float', 'base64'] - 'encoding_format'", "encoding_format"
            )
        dimensions = body.get("dimensions")
        if dimensions is not None and (isinstance(dimensions, bool) or not isinstance(dimensions, int)):
            raise ApiError(400, f"'dimensions' must be a whole number, got {dimensions!r}", "dimensions")
        inputs = [{"input": each} for each in _inputs(body.get("input"), max_inputs)]
        return cls(inputs, model, encoding_format, dimensions)


def _inputs(given: Any, most: int) -> List[Any]:
    """The list of inputs of the API's four forms: a text, texts, token
    ids, lists of token ids."""
    if isinstance(given, str):
        given = [given]
    elif isinstance(given, list) and given and all(type(x) is int for x in given):
        given = [given]  # one input as token ids
    if not isinstance(given, list):
        raise ApiError(400, "'input' must be a string, a list of strings, or token ids (lists of integers)", "input")
    if not given:
        raise ApiError(400, "'input' must not be empty: give at least one string or list of token ids", "input")
    if len(given) > most:
        raise ApiError(400, f"'input' holds {len(given)} items; at most {most} may be sent in one request", "input")
    for index, each in enumerate(given):
        if isinstance(each, str):
            if not each:
                raise ApiError(400, f"'input[{index}]' is an empty string; every input must hold text", "input")
        elif not isinstance(each, list) or not each or not all(type(x) is int for x in each):
            raise ApiError(
                400, f"'input[{index}]' must be a non-empty string or a non-empty list of token ids", "input"
            )
        elif min(each) < 0:
            raise ApiError(400, f"'input[{index}]' holds the token id {min(each)}; token ids start at 0", "input")
    return given


def embeddings_reply(outputs: List[Dict[str, Any]], request: EmbeddingsRequest) -> Dict[str, Any]:
    """The answer to ``request``: the model's ``outputs``, one
    ``{"embedding", "tokens"}`` per input, in order. Raises
    :class:`ApiError` for ``dimensions`` other than the model's own."""
    width = len(outputs[0]["embedding"])
    if request.dimensions is not None and request.dimensions != width:
        raise ApiError(400, f"This model does not support specifying dimensions: it makes {width} only", "dimensions")
    if request.encoding_format == "base64":
        vectors: List[Any] = [
            base64.b64encode(np.asarray(out["embedding"], dtype="<f4").tobytes()).decode("ascii") for out in outputs
        ]
    else:
        vectors = [out["embedding"] for out in outputs]  # arrays: written as they are (dumps_json)
    tokens = sum(int(out["tokens"]) for out in outputs)
    return {
        "object": "list",
        "data": [{"object": "embedding", "index": i, "embedding": v} for i, v in enumerate(vectors)],
        "model": request.model,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    }


def models_reply(model: str) -> Dict[str, Any]:
    """``GET /v1/models``: the one model served."""
    return {"object": "list", "data": [{"id": model, "object": "model", "created": _CREATED, "owned_by": "local"}]}


def error_reply(
    exc: BaseException, failed_input: Optional[int] = None, details: bool = False, made: Optional[str] = None
) -> Reply:
    """``(status, body, headers)`` of an error in OpenAI's shape: an
    :class:`ApiError` as it is; anything else by the project's statuses and
    headers (a 503 with ``Retry-After``, a 405 with ``Allow``);
    ``failed_input``: the input it is the error of, named in the message
    and the ``param``. A 500's message is the exception's only with
    ``details``; ``made``: its error id, given as ``"id"``."""
    status = _status(exc)
    if isinstance(exc, ApiError):
        param, code, headers = exc.param, exc.code, {}
    else:
        param, code, headers = None, None, error_headers(exc, status)
    message = str(exc) if status != 500 or details else INTERNAL_MESSAGE
    if failed_input is not None:
        message, param = f"input {failed_input}: {message}", f"input[{failed_input}]"
    kind = "invalid_request_error" if status < 500 else "server_error"
    error: Dict[str, Any] = {"message": message, "type": kind, "param": param, "code": code}
    if made is not None:
        error["id"] = made
    return status, {"error": error}, headers


def _status(exc: BaseException) -> int:
    """The status of an error of the API: an :class:`ApiError`'s own, else the project's."""
    return exc.status if isinstance(exc, ApiError) else status_for(exc)


def method_not_allowed(method: str, allowed: List[str]) -> Reply:
    """A 405 in OpenAI's shape, with ``Allow``: a route of this API answers
    every method it does not serve so, not in the web layer's own shape."""
    return error_reply(MethodNotAllowed(method, allowed))
