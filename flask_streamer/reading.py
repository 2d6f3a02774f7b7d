"""How flask_streamer reads a request: a werkzeug request as the default
input rule sees it (:mod:`streamer_core.web.body`), the body limit applied
once per request, the app's JSON reader, and what werkzeug raised while
reading a body as the project's error of its status."""

from __future__ import annotations

import functools
from typing import Any, Callable, Optional, Tuple, cast

import werkzeug.exceptions
from flask import Flask, Request
from flask.json.provider import DefaultJSONProvider
from werkzeug.exceptions import BadRequest, HTTPException
from werkzeug.sansio.utils import get_content_length

from streamer_core.errors import ClientDisconnected, InvalidInput, PayloadTooLarge, UnsupportedMediaType
from streamer_core.web.body import FormLimits, limit_body
from streamer_core.web.http import FAST_JSON, check_whole_body, loads_json, unreadable_chunks

__all__ = ["FlaskBody", "body_of", "limit_request_body", "loads_of", "read_error"]


class FlaskBody:
    """A werkzeug request as the default rule reads it (:class:`streamer_core.web.body.RequestBody`)."""

    reads_form = True

    def __init__(self, req: Request) -> None:
        self._req = req
        kind: type = type(req)
        #: The body may be read from the server's stream directly (see :meth:`data`).
        self._direct = _reads_body_plainly(kind) and "wsgi.input_terminated" in req.environ and not req.shallow
        if _reads_plainly(kind):
            # What werkzeug's properties give, read from the environment: they
            # would first build the request's header mapping, a tenth of
            # the batched route's own time (bench/README.md).
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
        req, length = self._req, self.content_length
        if self._direct and length is not None and "stream" not in req.__dict__ and _kept(req) is None:
            data = self._read_directly(req, length)
        else:
            data = req.get_data(cache=True, parse_form_data=False)
        if not self.chunked:
            check_whole_body(len(data), self.content_length)  # cut short: the client left
        return data

    @staticmethod
    def _read_directly(req: Request, length: int) -> bytes:
        """What ``req.get_data(cache=True)`` reads and keeps, read from the
        server's stream: werkzeug would first wrap it in a Python stream
        that reads it in pieces (a twentieth of a stubbed request's CPU,
        bench/README.md). Only for a server that ends the stream at the
        body's end (``wsgi.input_terminated``: gunicorn, gevent), where
        werkzeug reads it unwrapped or under ``max_content_length`` alone,
        and for a body of a known length no longer than that limit
        (werkzeug refuses a longer one itself). The bytes are kept where
        werkzeug keeps what it read (``get_data``, ``form`` and ``json``
        read them there), and ``request.stream`` is left as werkzeug's
        read leaves it: the server's stream, read to its end."""
        limit = req.max_content_length
        if limit is not None and length > limit:
            return req.get_data(cache=True, parse_form_data=False)  # werkzeug's 413
        try:
            data: bytes = req.environ["wsgi.input"].read(length)
        except (OSError, ValueError) as exc:  # as werkzeug's stream takes a server's error: the client left
            raise werkzeug.exceptions.ClientDisconnected() from exc
        setattr(req, _KEPT, data)
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
    req.max_content_length = limit

    def read_chunks(limit: Optional[int]) -> int:
        # One byte past the limit tells a body over it; werkzeug caches what
        # it read, and parses the form from that.
        req.max_content_length = None if limit is None else limit + 1
        try:
            return len(req.get_data(cache=True))
        except HTTPException:
            raise  # werkzeug's own: read_error answers it (past the limit: 413; cut short: 499)
        except Exception as exc:  # the server's decoder: a malformed chunk is the client's, not a 500
            raise unreadable_chunks(exc) from exc

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


#: Where werkzeug's request keeps the body ``get_data`` read.
_KEPT = "_cached_data"


def _kept(req: Request) -> Optional[bytes]:
    """The body werkzeug kept for ``req``, where it has read it."""
    kept: Optional[bytes] = getattr(req, _KEPT, None)
    return kept


@functools.cache  # one answer per request class
def _reads_body_plainly(kind: type) -> bool:
    """Whether a request of class ``kind`` reads its body as Flask's own
    request does, and werkzeug keeps what ``get_data`` read where
    :meth:`FlaskBody._read_directly` puts it (checked once, on a request
    of werkzeug's making): a class that overrides how the body is read (a
    ``get_data`` that decompresses, say) is read through it."""
    return _keeps_flasks(kind, ("get_data", "stream", "_get_stream_for_parsing")) and keeps_read_data(Request)


@functools.cache
def keeps_read_data(kind: type[Request]) -> bool:
    """Whether a request of class ``kind`` reads its body back from where
    werkzeug's has kept it since 0.9 (``_cached_data``: ``get_data``,
    ``json``): a later werkzeug that keeps it elsewhere is read through
    ``get_data``."""
    try:
        req = kind.from_values(method="POST", data=b'{"a": 1}', content_type="application/json")
        setattr(req, _KEPT, b'{"b": 2}')
        return bool(req.get_data() == b'{"b": 2}' and req.get_json() == {"b": 2})
    except Exception:  # an attribute this werkzeug refuses, or reads otherwise
        return False
