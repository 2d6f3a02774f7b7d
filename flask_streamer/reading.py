"""How flask_streamer reads a request: a werkzeug request as the default
input rule sees it (:mod:`streamer_core.web.body`), the body limit applied
once per request, the app's JSON reader, and what werkzeug raised while
reading a body as the project's error of its status."""

from __future__ import annotations

import functools
import io
from typing import Any, Callable, Optional, Tuple, cast

import werkzeug.exceptions
from flask import Flask, Request
from flask.json.provider import DefaultJSONProvider
from werkzeug.exceptions import BadRequest, HTTPException
from werkzeug.sansio.utils import get_content_length

from streamer_core.errors import ClientDisconnected, InvalidInput, PayloadTooLarge, UnsupportedMediaType
from streamer_core.web.body import FormLimits, limit_body
from streamer_core.web.http import FAST_JSON, check_whole_body, loads_json, read_chunked_body, unreadable_chunks

__all__ = ["FlaskBody", "body_of", "limit_request_body", "loads_of", "read_error"]


class FlaskBody:
    """A werkzeug request as the default rule reads it (:class:`streamer_core.web.body.RequestBody`)."""

    reads_form = True

    def __init__(self, req: Request) -> None:
        self._req = req
        kind: type = type(req)
        if _reads_plainly(kind):
            # What werkzeug's properties give, read from the environment: they
            # would first build the request's header mapping.
            environ = req.environ
            self.media_type = environ.get("CONTENT_TYPE", "").partition(";")[0].strip(" \t").lower()
            encoding = environ.get("HTTP_TRANSFER_ENCODING")
            self.content_length = get_content_length(environ.get("CONTENT_LENGTH"), encoding)
        else:
            self.media_type = req.mimetype
            self.content_length = req.content_length
            encoding = req.headers.get("Transfer-Encoding")
        self.chunked = self.content_length is None and "chunked" in (encoding or "").lower()

    def data(self) -> bytes:
        """The body, read by werkzeug's ``get_data`` and kept by it (a later
        ``request.get_data()``, ``json`` or ``form`` reads it back). Where
        the server ends the stream at the body's end (gunicorn, gevent,
        ``wsgi.input_terminated``), werkzeug reads the server's stream
        unwrapped, and what that read raises is the client leaving, as
        werkzeug's own wrapper would say."""
        try:
            data = self._req.get_data(cache=True, parse_form_data=False)
        except (OSError, ValueError) as exc:
            raise ClientDisconnected("the connection failed before the whole body arrived") from exc
        if not self.chunked:
            check_whole_body(len(data), self.content_length)  # cut short: the client left
        return data

    def boundary(self) -> str:
        return self._req.mimetype_params.get("boundary", "")

    def form_limits(self) -> FormLimits:
        return FormLimits(self._req.max_form_parts, self._req.max_form_memory_size)

    def parsed_form(self) -> Tuple[Any, Any]:
        return self._req.form, self._req.files


def loads_of(app: Flask) -> Callable[[bytes], Any]:
    """How the app reads JSON: orjson where it is installed and the app keeps
    Flask's own provider (a JSON body of a batched route costs less), else
    the app's provider."""
    return loads_json if FAST_JSON and type(app.json) is DefaultJSONProvider else app.json.loads


def read_error(exc: BaseException) -> Optional[InvalidInput]:
    """What werkzeug raised while reading a body, as the project's error of
    its status: a body over the limit (413), a malformed one (400), one cut
    short by a client that left (499, counted ``cancelled``)."""
    if not isinstance(exc, HTTPException):
        return None
    if isinstance(exc, werkzeug.exceptions.ClientDisconnected):
        decoder = exc.__context__
        if type(decoder).__name__ == "_InvalidClientInput":
            # gevent's pywsgi (gunicorn -k gevent_pywsgi) refused a chunk,
            # and werkzeug took its error for the client leaving: a 400
            # (the cycle makes it a disconnection if the client has left).
            return unreadable_chunks(cast(Exception, decoder))
        return ClientDisconnected("the connection closed before the whole body arrived")
    if isinstance(exc, werkzeug.exceptions.RequestEntityTooLarge):
        return PayloadTooLarge("the body is larger than this endpoint takes; send a smaller one")
    if isinstance(exc, werkzeug.exceptions.UnsupportedMediaType):
        return UnsupportedMediaType(exc.description or "the body is of a type this endpoint does not read")
    problem = InvalidInput(exc.description or "the request could not be parsed")
    if not isinstance(exc, BadRequest) and exc.code:
        problem.status = exc.code
    return problem


#: Where a request keeps the body limit applied to it (applied once), and
#: its :class:`FlaskBody`.
_LIMIT_KEY = "flask_streamer.max_body_bytes"
_BODY_KEY = "flask_streamer.body"


def limit_request_body(req: Request, app: Flask, max_bytes: Optional[int]) -> Optional[int]:
    """Apply the body limit to ``req``, once, and return it: ``max_bytes``,
    or the app's ``MAX_CONTENT_LENGTH`` when lower. A body over it is
    refused (413) at once by its ``Content-Length``; one sent in chunks is
    read here, whole but no further than the limit, and refused if it goes
    past (werkzeug would cut it at the limit without a word, and the model
    would get a truncated input). A body in chunks that the server did not
    decode is a 411."""
    if _LIMIT_KEY in req.environ:
        limit: Optional[int] = req.environ[_LIMIT_KEY]
        return limit
    app_limit = app.config.get("MAX_CONTENT_LENGTH")
    limit = app_limit if max_bytes is None else max_bytes if app_limit is None else min(max_bytes, app_limit)
    req.environ[_LIMIT_KEY] = limit

    def read_chunks(limit: Optional[int]) -> int:
        # One byte past the limit tells a body over it. werkzeug's stream is
        # the server's (which decoded the chunks), under the app's own
        # MAX_CONTENT_LENGTH where it is set; werkzeug reads the body back
        # from where it is put here (get_data, json, form).
        try:
            data = read_chunked_body(req.stream, limit)
        except InvalidInput as problem:
            if isinstance(problem.__cause__, HTTPException):
                raise problem.__cause__ from None  # werkzeug's own: read_error answers it (the app's limit: 413)
            raise
        if data:
            req.stream = io.BytesIO(data)
        else:
            data = req.get_data(cache=True)  # read already (a hook's get_data): werkzeug kept it
        return len(data)

    body = FlaskBody(req)
    req.environ[_BODY_KEY] = body
    limit_body(body, bool(req.environ.get("wsgi.input_terminated")), read_chunks, limit)
    return limit


def body_of(req: Request) -> FlaskBody:
    """``req`` as the default rule reads it: the one :func:`limit_request_body`
    made for it, where it has (a request's headers are read once)."""
    body = req.environ.get(_BODY_KEY)
    return body if type(body) is FlaskBody and body._req is req else FlaskBody(req)


@functools.cache  # one answer per request class
def _reads_plainly(kind: type) -> bool:
    """Whether a request of class ``kind`` reads its content type, length
    and transfer encoding as werkzeug's own request does (from the WSGI
    environment, through its header mapping), so that :class:`FlaskBody`
    may read them from the environment directly. A class that overrides
    one of them is read through its properties."""
    return _keeps_flasks(kind, ("mimetype", "content_length", "_parse_content_type"))


def _keeps_flasks(kind: type, names: Tuple[str, ...]) -> bool:
    """Whether request class ``kind`` has Flask's own ``names``: overrides none of them."""
    return all(getattr(kind, name, None) is getattr(Request, name, None) for name in names)
