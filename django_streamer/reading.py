"""How django_streamer reads a request: a Django request as the default
input rule sees it (:mod:`streamer_core.web.body`), the body limit applied
before it is read (a body sent in chunks read here, where the server
decoded them), and what Django raised while reading a body as the
project's error of its status. Public: :func:`request_item`,
:func:`request_inputs`, :func:`request_upload`, :func:`json_body`."""

from __future__ import annotations

import io
from typing import Any, Optional, Tuple

from django.conf import global_settings, settings
from django.core.exceptions import RequestDataTooBig, SuspiciousOperation
from django.core.handlers.wsgi import WSGIRequest
from django.http import HttpRequest, UnreadablePostError
from django.http.multipartparser import MultiPartParserError

from streamer_core import shortcuts
from streamer_core.errors import ClientDisconnected, InvalidInput, LengthRequired, PayloadTooLarge
from streamer_core.web.body import FormLimits, default_input, json_of, limit_body, upload_of
from streamer_core.web.http import MISSING, check_whole_body, is_json_type, loads_json, read_chunked_body

from . import conf
from .conf import max_body_bytes

__all__ = ["json_body", "request_inputs", "request_item", "request_upload", "body_length", "read_error"]


def json_body(request: HttpRequest) -> Any:
    """The request's JSON body, or :data:`~streamer_core.web.http.MISSING` when it
    is not a JSON request (``application/json`` or ``application/*+json``).
    Raises :class:`InvalidInput` (400) for a body that is not valid JSON,
    :class:`PayloadTooLarge` (413) for one over ``STREAMER["MAX_BODY_BYTES"]``."""
    if not is_json_type((request.content_type or "").lower()):
        return MISSING
    return json_of(_whole_body(request), loads_json)  # orjson where it is installed: see streamer_core.web.http


def _whole_body(request: HttpRequest) -> bytes:
    """The request's body, read once, up to ``STREAMER["MAX_BODY_BYTES"]``
    (10 MiB by default; past it a :class:`PayloadTooLarge`, 413), the limit
    flask_streamer reads by too. Django's ``request.body`` would also refuse
    one over ``DATA_UPLOAD_MAX_MEMORY_SIZE``, 2.5 MB by default: that one
    holds only where the project set it (as it does for form fields, which
    Django's parser reads, on every path)."""
    if not _keeps_bodies():  # Django's own reading, public: request.body
        length = body_length(request, max_body_bytes())
        body = request.body
        check_whole_body(len(body), length)
        return body
    length = None
    if not hasattr(request, "_body"):
        length = body_length(request, max_body_bytes())  # refused past the limit; a body in chunks is read here
    if (
        hasattr(request, "_body")  # read already
        or getattr(request, "_read_started", False)  # being read: Django says what is wrong
        or settings.DATA_UPLOAD_MAX_MEMORY_SIZE != global_settings.DATA_UPLOAD_MAX_MEMORY_SIZE
    ):
        body = request.body
        check_whole_body(len(body), length)  # cut short: the client left
        return body
    try:
        data = request.read()
    except OSError as exc:
        raise UnreadablePostError(*exc.args) from exc
    check_whole_body(len(data), length)
    # Where Django keeps a body it read: request.body, POST and FILES read from here.
    request._body = data
    request._stream = io.BytesIO(data)
    return data


def request_item(request: HttpRequest, field: Optional[str] = None) -> Any:
    """The model input of ``request`` by the default rule: the JSON body (its
    key ``field`` when given), else the form field ``field``, else the
    uploaded file ``field`` as ``bytes`` (``curl -F "file=@cat.jpg"``).
    Raises :class:`InvalidInput` (400) saying what to send, and
    :class:`PayloadTooLarge` (413) for a body over
    ``STREAMER["MAX_BODY_BYTES"]`` (10 MiB by default), before reading it."""
    limit = max_body_bytes()
    length = body_length(request, limit)
    return default_input(_DjangoBody(request, length), field, limit, loads_json)


def request_inputs(request: HttpRequest, field: Optional[str] = None) -> Any:
    """The inputs of ``request`` to a view that takes many (``many=True``):
    the JSON array (its key ``field`` when given), else every value of the
    form field ``field``, else every uploaded file of it, as ``bytes``.
    Raises as :func:`request_item` does; the view checks it is a list of at
    most ``STREAMER["MAX_INPUTS"]``."""
    limit = max_body_bytes()
    length = body_length(request, limit)
    return default_input(_DjangoBody(request, length), field, limit, loads_json, many=True)


def request_upload(request: HttpRequest, field: str = "file") -> bytes:
    """The bytes of ``request``'s uploaded file ``field``, for a view that
    takes a file and nothing else (``curl -F "file=@cat.jpg"``). Unlike
    :func:`request_item`, it never tells a client to send JSON: a body that
    is not a multipart form is a 415, no body, a text field or a form
    without the file a 400, each saying how to send the file; a file over
    ``STREAMER["MAX_BODY_BYTES"]`` a 413."""
    limit = max_body_bytes()
    length = body_length(request, limit)
    return upload_of(_DjangoBody(request, length), field, limit)


class _DjangoBody:
    """A Django request as the default rule reads it
    (:class:`streamer_core.web.body.RequestBody`); a body sent in chunks has
    been read by then (see :func:`body_length`), and has its length."""

    def __init__(self, request: HttpRequest, length: Optional[int], chunked: bool = False) -> None:
        self._request = request
        self.media_type = (request.content_type or "").lower()
        self.content_length = length
        self.chunked = chunked
        self.reads_form = request.method == "POST"  # Django's POST and FILES: a POST's only

    def data(self) -> bytes:
        return _whole_body(self._request)

    def boundary(self) -> str:
        return str((self._request.content_params or {}).get("boundary", ""))

    def form_limits(self) -> Optional[FormLimits]:
        """Django's limits on the number of fields and of files, or ``None``
        where Django's own parser must read the form, so that its settings
        and errors apply: a body over ``DATA_UPLOAD_MAX_MEMORY_SIZE``
        (``request.body`` would refuse what the form parser takes), a
        non-UTF-8 request, a stream already being read."""
        request, length = self._request, self.content_length
        memory = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
        if not length or (memory is not None and length > memory):
            return None
        if (request.encoding or settings.DEFAULT_CHARSET).lower().replace("_", "-") not in ("utf-8", "utf8"):
            return None
        if getattr(request, "_read_started", False) and not hasattr(request, "_body"):
            return None
        limits = [n for n in (settings.DATA_UPLOAD_MAX_NUMBER_FIELDS, settings.DATA_UPLOAD_MAX_NUMBER_FILES) if n]
        return FormLimits(min(limits, default=None))

    def parsed_form(self) -> Tuple[Any, Any]:
        return self._request.POST, self._request.FILES


def body_length(request: HttpRequest, limit: Optional[int]) -> Optional[int]:
    """The body's length, refused (413) when over ``limit``: by its
    ``Content-Length`` before it is read, or, sent in chunks, as it is read.
    Django's WSGI request reads no body without a ``Content-Length``: one
    sent in chunks is read here (the server decoded them: gunicorn, uWSGI),
    no further than one byte past the limit, and kept as the request's body;
    a server that does not decode chunks (``runserver``) gets a 411."""
    raw = request.META.get("CONTENT_LENGTH")
    chunked = not raw and "chunked" in request.META.get("HTTP_TRANSFER_ENCODING", "").lower()
    if chunked and isinstance(request, WSGIRequest) and not _keeps_bodies():
        raise LengthRequired(
            "a body sent in chunks is read only through the django-body shortcut, which is off here "
            "(streamer_core.shortcuts): send it with a Content-Length"
        )
    if chunked and isinstance(request, WSGIRequest):
        environ = request.environ

        def read_chunks(limit: Optional[int]) -> int:
            data = read_chunked_body(environ["wsgi.input"], limit)
            # Django's own parsing (request.body, POST and FILES) reads from
            # here, and the multipart parser by the length.
            request._body = data
            request.META["CONTENT_LENGTH"] = str(len(data))
            return len(data)

        limit_body(
            _DjangoBody(request, None, chunked=True), bool(environ.get("wsgi.input_terminated")), read_chunks, limit
        )
        return len(request._body)
    try:
        length: Optional[int] = int(raw or 0)
    except ValueError:
        length = None
    limit_body(_DjangoBody(request, length), True, lambda _: 0, limit)
    return length


def _keeps_bodies() -> bool:
    """Whether a body is read by the shortcut through Django's request
    (``django-body`` of :mod:`streamer_core.shortcuts`): read once and kept
    where Django keeps what ``request.body`` read, a body sent in chunks
    read too. Otherwise Django's ``request.body`` reads it, and a body in
    chunks, which Django's WSGI request does not read, is a 411."""
    return shortcuts.allowed("django-body", conf.shortcuts())


def read_error(exc: BaseException) -> Optional[InvalidInput]:
    """What Django raised while reading a body, as the project's error of its
    status: a body over ``DATA_UPLOAD_MAX_MEMORY_SIZE`` (413), a malformed
    multipart body or one Django refuses, too many fields or files (400), an
    upload the client gave up (Django's ``UnreadablePostError``: 499,
    counted ``cancelled``)."""
    if isinstance(exc, UnreadablePostError):
        return ClientDisconnected(f"the body could not be read whole; the client left: {exc}")
    if isinstance(exc, RequestDataTooBig):
        return PayloadTooLarge(f"the body is larger than this server takes: {exc}")
    if isinstance(exc, (MultiPartParserError, SuspiciousOperation)):
        return InvalidInput(f"the request body could not be read: {exc}")
    return None
