"""What a batched HTTP endpoint answers, whatever the web framework.

The Flask extension and the Django app share this mapping, so one model
behaves the same behind either:

==========================================  ======  =========================
what happened                               status  body / headers
==========================================  ======  =========================
the request cannot be parsed into an input   400    ``{"error": ...}``
a method the endpoint does not serve         405    ``Allow``
a body larger than the server takes          413
a body of a media type that is not read      415
the model raised for this input              500    ``internal error`` and an id
the call timed out                           504
queue full, no worker, broker down, closing  503    ``Retry-After`` (seconds)
==========================================  ======  =========================

Every body is JSON: ``{"error": {"status", "type", "message"}}``, plus
``"traceback"`` when the framework runs in debug mode. A 500 says nothing
of what failed unless the app asks (``error_details``, by default its
debug mode): its type is ``internal_error``, its message ``internal
error``, and its ``id`` is the one the log line of its traceback carries.
"""

from __future__ import annotations

import concurrent.futures
import decimal
import json
import logging
import math
import os
import threading
import time
import traceback
import uuid
from typing import Any, Callable, Dict, Mapping, Optional, Tuple, TypeVar

from ..errors import (
    ClientDisconnected,
    InvalidInput,
    ItemCostError,
    LengthRequired,
    MethodNotAllowed,
    PayloadTooLarge,
    QueueFullError,
    RemoteTraceback,
    SerializationError,
    StreamerClosedError,
    StreamerTimeoutError,
    UnavailableError,
    UnsupportedMediaType,
)

__all__ = [
    "MISSING",
    "RETRY_AFTER_FULL",
    "RETRY_AFTER_DOWN",
    "error_response",
    "error_headers",
    "error_body",
    "status_for",
    "log_unavailable",
    "item_from_request",
    "read_upload",
    "check_body_size",
    "read_chunked_body",
    "check_whole_body",
    "unreadable_chunks",
    "check_read_size",
    "refuse_undecoded_chunks",
    "retry_after",
    "check_media_type",
    "to_jsonable",
    "dumps_json",
    "json_answer",
    "loads_json",
    "FAST_JSON",
]

T = TypeVar("T")

#: ``Retry-After`` seconds: a full queue drains within a batch or two; a
#: missing worker or broker takes longer to come back.
RETRY_AFTER_FULL = 1
RETRY_AFTER_DOWN = 5


class _Missing:
    def __repr__(self) -> str:
        return "MISSING"


#: Stands for "the request has no JSON body".
MISSING: Any = _Missing()


def status_for(exc: BaseException) -> int:
    """The HTTP status for an exception raised by parsing or by a call.
    A :class:`SerializationError` is a 500: a client's JSON or form always
    crosses to a worker, so an input that cannot was made by the app's parse
    hook, and an output that cannot, by the model."""
    if isinstance(exc, InvalidInput):
        return exc.status
    if isinstance(exc, ItemCostError):
        return 400  # the input could not be costed: the client's to fix
    if isinstance(exc, StreamerTimeoutError):
        return 504
    if isinstance(exc, concurrent.futures.CancelledError):
        return 499  # the call was given up for a client that has gone (nginx's "client closed request")
    if isinstance(exc, (UnavailableError, StreamerClosedError)):
        return 503
    return 500


#: Seconds between two log lines for one kind of 503 or 504 of one endpoint.
UNAVAILABLE_LOG_INTERVAL_S = 10.0

_unavailable_lock = threading.Lock()
# (endpoint, status, exception type) -> (when it was last logged, how many since)
_unavailable_seen: Dict[Tuple[str, int, str], Tuple[float, int]] = {}


def _new_lock_after_fork() -> None:
    # Held by a thread of the parent at the fork (logging a 503), it would stay held here.
    global _unavailable_lock
    _unavailable_lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_new_lock_after_fork)


def log_unavailable(log: logging.Logger, endpoint: str, status: int, exc: BaseException) -> None:
    """Log that ``endpoint`` answered ``status`` (a 503 or 504) because of
    ``exc``: the first time, then at most once every
    :data:`UNAVAILABLE_LOG_INTERVAL_S` seconds for the same endpoint, status
    and error type, saying how many more there were since the last line.
    While Redis or the workers are down every request fails the same way,
    and a line for each would bury what else the log says; the metrics
    count every one (``streamer_requests_total``)."""
    key = (endpoint, status, type(exc).__name__)
    now = time.monotonic()
    with _unavailable_lock:
        last, since = _unavailable_seen.get(key, (float("-inf"), 0))
        if now - last < UNAVAILABLE_LOG_INTERVAL_S:
            _unavailable_seen[key] = (last, since + 1)
            return
        _unavailable_seen[key] = (now, 0)
    more = f" ({since} more like it since the last such line)" if since else ""
    log.warning("%s answered %d: %s%s", endpoint, status, exc, more, stacklevel=2)


#: What a 500 says of its error where the app does not ask for its details.
INTERNAL_ERROR = "internal_error"
INTERNAL_MESSAGE = "internal error"


def error_id() -> str:
    """A new id for a 500: the client gets it, the log line of its traceback
    carries it, so that one finds the other."""
    return uuid.uuid4().hex[:16]


def error_response(
    exc: BaseException, *, debug: bool = False, details: Optional[bool] = None, error_id: Optional[str] = None
) -> Tuple[int, Dict[str, Any], Dict[str, str]]:
    """``(status, json_body, headers)`` for ``exc``. A 500 carries
    ``error_id`` as ``"id"``, and says the exception's type and message only
    with ``details`` (default: ``debug``): they can name paths, data and
    internals that clients should not see; otherwise it says
    :data:`INTERNAL_MESSAGE`. The traceback (the worker's, when the error
    crossed a process) is included only when ``debug``, and not where
    ``details`` is false."""
    status = status_for(exc)
    shown = debug if details is None else details
    if status == 500 and not shown:
        body = error_body(status, INTERNAL_ERROR, INTERNAL_MESSAGE)
    else:
        body = error_body(status, type(exc).__name__, str(exc))
    error = body["error"]
    if status == 500 and error_id is not None:
        error["id"] = error_id
    if debug and shown:
        error["traceback"] = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
        cause = exc.__cause__
        if isinstance(cause, RemoteTraceback):
            error["worker_traceback"] = cause.tb
    return status, body, error_headers(exc, status)


def error_headers(exc: BaseException, status: int) -> Dict[str, str]:
    """The headers of an error answer of ``status`` for ``exc``: ``Allow``
    for a method not served, ``Retry-After`` on a 503."""
    headers: Dict[str, str] = {}
    if isinstance(exc, MethodNotAllowed):
        headers["Allow"] = ", ".join(exc.allowed)
    if status == 503:
        headers["Retry-After"] = str(retry_after(exc))
    return headers


def error_body(status: int, kind: str, message: str) -> Dict[str, Any]:
    """Every JSON error's body: ``{"error": {"status", "type", "message"}}``."""
    return {"error": {"status": status, "type": kind, "message": message}}


def retry_after(exc: BaseException) -> int:
    """The ``Retry-After`` seconds of a 503 for ``exc``: its own
    (``retry_after_s``, a model still loading, say), else
    :data:`RETRY_AFTER_FULL` for a full queue, :data:`RETRY_AFTER_DOWN` for
    anything else."""
    own = getattr(exc, "retry_after_s", None)
    if own is not None:
        return max(1, int(math.ceil(own)))
    return RETRY_AFTER_FULL if isinstance(exc, QueueFullError) else RETRY_AFTER_DOWN


def item_from_request(
    json_body: Any,
    form: Optional[Mapping[str, Any]],
    field: Optional[str],
    files: Optional[Mapping[str, Any]] = None,
    max_bytes: Optional[int] = None,
) -> Any:
    """The model input of a request, by the default rule: the JSON body (its
    ``field`` key when the route names a field), else the form field
    ``field``, else the uploaded file ``field`` (of a ``multipart/form-data``
    body, as ``curl -F "file=@cat.jpg"`` sends) as ``bytes``, at most
    ``max_bytes`` of them. ``json_body`` is :data:`MISSING` when the request
    has no JSON body. Raises :class:`InvalidInput` with a message for the
    client (:class:`PayloadTooLarge`, a 413, for a file over ``max_bytes``)."""
    if json_body is not MISSING:
        if field is None:
            return json_body
        if not isinstance(json_body, dict):
            raise InvalidInput(f'send a JSON object with the key "{field}", e.g. {{"{field}": ...}}')
        if field not in json_body:
            raise InvalidInput(f'the JSON body has no key "{field}"; send {{"{field}": ...}}')
        return json_body[field]
    if field is not None and form is not None and field in form:
        return form[field]
    if field is not None and files is not None and field in files:
        return read_upload(files[field], field, max_bytes)
    if field is None:
        raise InvalidInput("send the input as a JSON body (Content-Type: application/json)")
    if files is None:  # a file is not read here: say only what is
        raise InvalidInput(f'send the input as JSON {{"{field}": ...}} or as the form field "{field}"')
    raise InvalidInput(
        f'send the input as JSON {{"{field}": ...}}, as the form field "{field}", '
        f'or as the file "{field}" of a multipart form (curl -F "{field}=@path")'
    )


def read_upload(upload: Any, field: str, max_bytes: Optional[int]) -> bytes:
    """The bytes of an uploaded file (Flask's ``FileStorage``, Django's
    ``UploadedFile``: anything with ``read(n)``; or its bytes), reading no more than one
    byte past ``max_bytes``. Raises :class:`PayloadTooLarge` past it and
    :class:`InvalidInput` for an empty file."""
    if isinstance(upload, bytes):  # read already (streamer_core.web.multipart)
        data = upload
    else:
        data = upload.read() if max_bytes is None else upload.read(max_bytes + 1)
    if max_bytes is not None and len(data) > max_bytes:
        raise PayloadTooLarge(f'the file "{field}" is larger than {max_bytes} bytes, the most this endpoint takes')
    if not data:
        raise InvalidInput(f'the file "{field}" is empty')
    return bytes(data)


def read_chunked_body(stream: Any, max_bytes: Optional[int]) -> bytes:
    """A body sent in chunks (no ``Content-Length``), read whole from
    ``stream`` (the server decoded the chunks), but no more than one byte
    past ``max_bytes``: a body over it raises :class:`PayloadTooLarge`
    rather than reaching the model cut short. What the server's decoder
    raises (a chunk cut short by a client that left, a malformed chunk
    size: gunicorn's ``NoMoreData``, ``InvalidChunkSize``) is an
    :class:`InvalidInput` (400), not a server error."""
    try:
        data = stream.read() if max_bytes is None else stream.read(max_bytes + 1)
        if max_bytes is not None:
            while len(data) <= max_bytes:  # a stream may return less than asked before its end
                more = stream.read(max_bytes + 1 - len(data))
                if not more:
                    break
                data += more
    except Exception as exc:
        raise unreadable_chunks(exc) from exc
    check_read_size(len(data), max_bytes)
    return bytes(data)


def unreadable_chunks(exc: Exception) -> InvalidInput:
    """The 400 for what a server's decoder raised reading a body sent in
    chunks (see :func:`read_chunked_body`)."""
    return InvalidInput(f"the body sent in chunks could not be read: {exc!r}")


def check_whole_body(size: int, content_length: Optional[int]) -> None:
    """Raise :class:`ClientDisconnected` when fewer than ``content_length``
    bytes arrived (``size``): the client closed its connection mid-body
    (servers hand the app what came, without a word)."""
    if content_length is not None and size < content_length:
        raise ClientDisconnected(
            f"the connection closed after {size} of the body's {content_length} bytes (its Content-Length)"
        )


def check_read_size(size: int, max_bytes: Optional[int]) -> None:
    """Refuse a body of which ``size`` bytes were read, more than
    ``max_bytes``, with :class:`PayloadTooLarge`."""
    if max_bytes is not None and size > max_bytes:
        raise PayloadTooLarge(
            f"the body is more than the {max_bytes} bytes this endpoint takes; "
            f"send a smaller one, or raise the server's {BODY_LIMIT_SETTING}"
        )


def refuse_undecoded_chunks(chunked: bool, input_terminated: bool) -> None:
    """Raise :class:`LengthRequired` (411) for a body sent in chunks to a
    server that does not decode them (``wsgi.input_terminated`` unset, as
    under Python's ``wsgiref``, Django's ``runserver``): read as it is, it
    would be empty or garbled."""
    if chunked and not input_terminated:
        raise LengthRequired(
            "this server cannot read a body sent in chunks (Transfer-Encoding: chunked): send it with a Content-Length"
        )


def check_body_size(length: Optional[int], max_bytes: Optional[int]) -> None:
    """Refuse a body of ``length`` bytes (``Content-Length``; ``None`` when
    not sent) over ``max_bytes`` with :class:`PayloadTooLarge`, before it is
    read."""
    if max_bytes is not None and length is not None and length > max_bytes:
        raise PayloadTooLarge(
            f"the body is {length} bytes, more than the {max_bytes} this endpoint takes; "
            f"send a smaller one, or raise the server's {BODY_LIMIT_SETTING}"
        )


#: The setting a 413 names, as each web layer spells it (a batched route's
#: ``max_body_bytes`` keyword overrides it for that route).
BODY_LIMIT_SETTING = 'STREAMER_MAX_BODY_BYTES (Flask\'s config; Django: STREAMER["MAX_BODY_BYTES"])'

#: Media types of request bodies the default parsing reads: JSON, and forms.
FORM_TYPES = ("application/x-www-form-urlencoded", "multipart/form-data")


def is_json_type(content_type: str) -> bool:
    """Whether ``content_type`` (lower case, without parameters) is JSON."""
    return content_type == "application/json" or (
        content_type.startswith("application/") and content_type.endswith("+json")
    )


def check_media_type(content_type: Optional[str], has_body: bool, forms: bool = True) -> None:
    """Raise :class:`UnsupportedMediaType` (415) for a body of a type the
    default parsing does not read: anything but JSON and forms. ``forms``:
    whether the endpoint takes its input from a form at all (one that takes
    the whole JSON body does not), so that the answer names only what it takes."""
    kind = (content_type or "").split(";", 1)[0].strip().lower()
    if has_body and kind and not is_json_type(kind) and kind not in FORM_TYPES:
        instead = " or a form" if forms else ""
        raise UnsupportedMediaType(
            f"a body of type {kind} is not read here: send JSON (Content-Type: application/json){instead}"
        )


def to_jsonable(value: Any) -> Any:
    """Make a model output JSON-serialisable: NumPy arrays and scalars and
    torch tensors become lists and numbers, tuples become lists."""
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    if isinstance(value, dict):
        return {str(k): to_jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_jsonable(v) for v in value]
    tolist = getattr(value, "tolist", None)  # numpy arrays and scalars, torch tensors
    if callable(tolist):
        detach = getattr(value, "detach", None)
        if callable(detach):  # a torch tensor: off the autograd graph and the GPU first
            value = detach().cpu()
        return value.tolist()
    return value


_orjson: Any
try:
    import orjson as _orjson
except ImportError:  # the standard library's json, with to_jsonable on the way
    _orjson = None

#: Whether :func:`dumps_json` and :func:`loads_json` use orjson (installed
#: with the ``flask`` and ``django`` extras).
FAST_JSON = _orjson is not None
_ORJSON_OPTIONS = (_orjson.OPT_SERIALIZE_NUMPY | _orjson.OPT_NON_STR_KEYS) if _orjson is not None else 0


def _orjson_default(value: Any) -> Any:
    """What orjson does not serialise by itself: torch tensors (as arrays,
    off the GPU and the autograd graph), arrays it cannot take whole (not
    C-contiguous, an unusual dtype) and any other ``tolist()``-able value,
    and ``Decimal`` (as a string, as Django's encoder does)."""
    detach = getattr(value, "detach", None)
    if callable(detach):  # a torch tensor
        tensor = detach().cpu()
        try:
            return tensor.numpy()
        except (TypeError, RuntimeError):  # bfloat16 and the like: no numpy dtype
            return tensor.tolist()
    tolist = getattr(value, "tolist", None)
    if callable(tolist):
        return tolist()
    return _decimal_as_text(value)


def dumps_json(value: Any) -> bytes:
    """A model output as a JSON body, UTF-8. With orjson, NumPy arrays and
    scalars and CPU tensors are written as they are, without ``tolist()``
    (an embedding in a fraction of the standard library's time), float32
    values as the shortest text that reads back as the same float32, and
    NaN and infinities as ``null`` (JSON has no NaN).
    Without orjson, :func:`to_jsonable` and the standard library. Raises
    ``TypeError`` or ``ValueError`` for a value that has no JSON form."""
    if _orjson is not None:
        try:
            data: bytes = _orjson.dumps(value, default=_orjson_default, option=_ORJSON_OPTIONS)
            return data
        except _orjson.JSONEncodeError:
            try:  # what only the standard library writes: integers beyond 64 bits
                return _stdlib_dumps(value)
            except (TypeError, ValueError):
                pass
            raise
    return _stdlib_dumps(value)


def json_answer(output: Any, dumps: Callable[[Any], T] = dumps_json) -> T:  # type: ignore[assignment]
    """A model's output as the body of a batched endpoint's answer, by
    ``dumps`` (or as the response a framework's JSON provider makes of it);
    an output with no JSON form is the model's fault, a
    :class:`SerializationError` (500) saying so."""
    try:
        return dumps(output)
    except (TypeError, ValueError) as exc:
        raise SerializationError(f"the model's output for this input cannot be sent as JSON: {exc}") from exc


def _stdlib_dumps(value: Any) -> bytes:
    return json.dumps(to_jsonable(value), separators=(",", ":"), default=_decimal_as_text).encode()


def _decimal_as_text(value: Any) -> Any:
    """A ``Decimal`` as a string, as Django's encoder writes it; anything
    else has no JSON form."""
    if isinstance(value, decimal.Decimal):
        return str(value)
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


def loads_json(data: bytes) -> Any:
    """A request's JSON body. Raises ``ValueError`` saying what is wrong
    with it, a body nested too deep included (never ``RecursionError``)."""
    if _orjson is not None:
        return _orjson.loads(data)  # orjson.JSONDecodeError is a ValueError; it limits nesting itself
    try:
        return json.loads(data)
    except RecursionError:
        raise ValueError("the JSON is nested too deep") from None
