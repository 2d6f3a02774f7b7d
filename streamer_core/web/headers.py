"""Request headers for gevent's HTTP server (gunicorn's ``-k gevent_pywsgi``,
the examples' worker class), read without the email package's parser.

gevent's ``WSGIHandler`` reads a request's headers with
``http.client.parse_headers``, which joins the lines and hands them to the
``email`` package's parser, a tenth of what a request with the forward
pass stubbed costs the example's web process, and three times what reading
them here costs (the docs' Performance page, "Reading request headers
without the e-mail parser"). Almost every request's
headers are lines of ``Name: value``. :func:`read_headers` reads the lines
as ``http.client`` does (the same limits on a line's length and on their
number) and, where every one has that shape, stores each in gevent's own
message class as the parser would (``set_raw``, the value as the parser
cuts it); any other block (a folded line, a line that is not a header, a
lone carriage return inside one) goes to the parser itself. Either way
the handler gets the same object, field for field, for every block.

gevent then asks that object for a header by name seven times a request,
each ask a walk over every header, and writes the headers out as text to
split them again into the environ's names. :func:`quick_request_reading`
gives a handler that walks them once, for a request of HTTP/1.1 or 1.0,
into the same handler fields and environ.
"""

from __future__ import annotations

import re
from http import client
from typing import Any, BinaryIO, Dict, List, Optional
from urllib.parse import unquote

__all__ = ["quick_header_reading", "quick_request_reading", "read_headers"]

# http.client's limits, read from it where it has them.
_MAX_LINE = getattr(client, "_MAXLINE", 65536)
_MAX_HEADERS = getattr(client, "_MAXHEADERS", 100)
_ENDS = (b"\r\n", b"\n", b"")
# A header line as the email package's parser takes one, and that it takes
# whole: a name of printable characters but ":" (none empty), ":", then the
# value, with no carriage return inside (the parser breaks lines there too)
# and no line after it that continues it (a folded header starts with
# whitespace, and does not match).
_PLAIN = re.compile(r"([\x21-\x39\x3b-\x7e]+):[ \t]*([^\r]*?)\r?\n?\Z")
# gevent's message class and its own reading, imported on first use.
_GEVENT: List[Any] = []


def read_headers(fp: BinaryIO, *args: Any) -> Any:
    """The headers of the request on ``fp``, as gevent's ``headers_factory``
    reads them (its ``OldMessage``, with ``status`` set to ``"Line too long"``
    for a line over ``http.client``'s limit), from the same bytes of ``fp``."""
    if not _GEVENT:
        from gevent.pywsgi import OldMessage, headers_factory

        _GEVENT.extend((OldMessage, headers_factory))
    message_class, parse = _GEVENT
    lines = []
    while True:
        line = fp.readline(_MAX_LINE + 1)
        if len(line) > _MAX_LINE:
            message = message_class()
            message.status = "Line too long"
            return message
        lines.append(line)
        if len(lines) > _MAX_HEADERS:
            raise client.HTTPException(f"got more than {_MAX_HEADERS} headers")
        if line in _ENDS:
            break
    message = message_class()
    store = message.set_raw
    for line in lines[:-1]:
        plain = _PLAIN.match(line.decode("iso-8859-1"))
        if plain is None:
            return parse(_Lines(lines))
        store(plain.group(1), plain.group(2))
    message.set_payload("")  # the parser's, for a block with nothing after it
    return message


class _Lines:
    """Lines already read, handed to ``http.client.parse_headers`` as the
    file it reads them from."""

    def __init__(self, lines: List[bytes]) -> None:
        self._lines = iter(lines)

    def readline(self, limit: int = -1) -> bytes:
        return next(self._lines, b"")


def _message_class(handler: Any, *args: Any) -> Any:
    """A handler's ``MessageClass``: the request's headers by :func:`read_headers`."""
    return read_headers(*args)


def quick_header_reading(handler: Any) -> Any:
    """For a handler class of gevent's HTTP server that reads headers as
    gevent does, the ``MessageClass`` to give it (:func:`read_headers`);
    ``None`` for any other (one of its own, another server's, or a gevent
    whose reading is not the one this module repeats)."""
    try:
        from gevent import pywsgi
    except ImportError:
        return None
    if not (isinstance(handler, type) and issubclass(handler, pywsgi.WSGIHandler)):
        return None
    if getattr(handler, "MessageClass", None) is not pywsgi.WSGIHandler.MessageClass or not hasattr(
        pywsgi, "OldMessage"
    ):
        return None
    factory = getattr(pywsgi, "headers_factory", None)
    if getattr(factory, "__module__", None) != "gevent.pywsgi":  # another Python's mimetools
        return None
    return _message_class


# -- the request line and the environ --------------------------------------

#: The versions whose request line :func:`quick_request_reading`'s handler
#: reads itself (gevent's check passes both); any other goes to gevent.
_VERSIONS = ("HTTP/1.1", "HTTP/1.0")
#: The environ's names gevent gives no ``HTTP_`` copy of.
_UNCOPIED = ("CONTENT_TYPE", "CONTENT_LENGTH")


def quick_request_reading(handler: Any) -> Optional[Dict[str, Any]]:
    """For a handler class of gevent's HTTP server that reads requests and
    makes their environ as gevent (or gunicorn's ``-k gevent_pywsgi``) does,
    the attributes of a subclass that does the same with less: ``None`` for
    any other handler.

    gevent's ``read_request`` and ``get_environ`` ask the headers' message
    for a header by name seven times a request (``transfer-encoding``,
    ``content-length`` twice, ``connection`` twice, ``content-type``,
    ``upgrade``), and the email package walks every header, lowering each
    name, for every one; then it writes each header back out as a line of
    text to split it again into the environ's ``HTTP_`` names. Here the
    headers are walked once into a mapping of lowered names to their first
    value (what the message's ``get`` answers), and the environ is made from
    the message's pairs directly. The request line of any version but
    HTTP/1.1 and HTTP/1.0 goes to gevent's own reading, as does making the
    environ of such a request. What the handler and the app see is gevent's,
    value for value (the tests compare both over any head of a request).
    The handler must read headers into gevent's message, by gevent's reading
    or :func:`read_headers`."""
    try:
        from gevent import pywsgi
    except ImportError:
        return None
    if not (isinstance(handler, type) and issubclass(handler, pywsgi.WSGIHandler)):
        return None
    base = pywsgi.WSGIHandler
    if getattr(handler, "MessageClass", None) not in (base.MessageClass, _message_class):
        return None  # headers read into a message of another kind
    for name in ("read_request", "_check_http_version", "_headers", "_connection_upgrade_requested"):
        if getattr(handler, name, None) is not getattr(base, name, handler):
            return None  # a handler that reads requests its own way
    invalid = getattr(pywsgi, "_InvalidClientRequest", None)
    if invalid is None or not hasattr(pywsgi, "Input"):
        return None
    environ_of = getattr(handler, "get_environ", None)
    if environ_of is base.get_environ:
        gunicorns = False
    elif environ_of is _gunicorns_get_environ():
        gunicorns = True  # gunicorn's adds its socket and the raw URI to gevent's
    else:
        return None
    reader = _RequestReader(base.read_request, environ_of, invalid, pywsgi.Input, gunicorns)

    def read_request(self: Any, raw_requestline: str) -> bool:
        """gevent's ``read_request``, each header looked up once."""
        return reader.read(self, raw_requestline)

    def get_environ(self: Any) -> Dict[str, Any]:
        """gevent's ``get_environ``, from the headers as read."""
        return reader.environ(self)

    return {"read_request": read_request, "get_environ": get_environ, "_first": None}


def _gunicorns_get_environ() -> Any:
    """gunicorn's ``PyWSGIHandler.get_environ``, where gunicorn is installed."""
    try:
        from gunicorn.workers.ggevent import PyWSGIHandler
    except ImportError:
        return None
    return PyWSGIHandler.get_environ


class _RequestReader:
    """The two methods of :func:`quick_request_reading`'s handler, with
    gevent's own (``read_request``, ``get_environ``) for what they leave to
    it. A request's lowered header names and first values are kept on the
    handler (``_first``) from its reading to its environ; ``None`` there
    says that gevent read the request, and makes its environ."""

    def __init__(self, read_request: Any, get_environ: Any, invalid: type, input_class: Any, gunicorns: bool) -> None:
        self._read_request = read_request
        self._get_environ = get_environ
        self._invalid = invalid
        self._input = input_class
        self._gunicorns = gunicorns

    def read(self, handler: Any, raw_requestline: str) -> bool:
        """gevent's ``read_request``: the request line, the headers, the
        body's length and whether the connection closes after it."""
        words = raw_requestline.split()
        if len(words) != 3 or words[2] not in _VERSIONS:
            handler._first = None
            return bool(self._read_request(handler, raw_requestline))
        handler.requestline = raw_requestline.rstrip()
        handler.command, handler.path, version = words
        handler.request_version = version
        headers = handler.headers = handler.MessageClass(handler.rfile, 0)
        if headers.status:
            raise self._invalid(f"Invalid headers status: {headers.status!r}")
        first: Dict[str, str] = {}
        for name, value in headers._headers:
            first.setdefault(name.lower(), value)
        if first.get("transfer-encoding", "").lower() == "chunked" and "content-length" in first:
            del headers["content-length"]
            del first["content-length"]
        length: Any = first.get("content-length")
        if length is not None:
            length = int(length)
            if length < 0:
                raise self._invalid(f"Invalid Content-Length: {length!r}")
            if length and handler.command == "HEAD":
                raise self._invalid("Unexpected Content-Length")
        handler.content_length = length
        if version == "HTTP/1.1":
            handler.close_connection = first.get("connection", "").lower() == "close"
        else:
            handler.close_connection = first.get("connection", "close").lower() != "keep-alive"
        handler._first = first
        return True

    def environ(self, handler: Any) -> Dict[str, Any]:
        """gevent's ``get_environ`` (and gunicorn's two keys, where its
        handler's was gunicorn's) for a request :meth:`read` read."""
        first: Optional[Dict[str, str]] = handler._first
        if first is None:
            return self._get_environ(handler)  # type: ignore[no-any-return]
        env: Dict[str, Any] = handler.server.get_environ()
        env["REQUEST_METHOD"] = handler.command
        env["SCRIPT_NAME"] = ""
        raw_path: str = handler.path
        path, _, query = raw_path.partition("?")
        env["PATH_INFO"] = unquote(path, encoding="latin-1") if "%" in path else path
        env["QUERY_STRING"] = query
        content_type = first.get("content-type")
        if content_type is not None:
            env["CONTENT_TYPE"] = content_type
        length = first.get("content-length")
        if length:
            env["CONTENT_LENGTH"] = length
        env["SERVER_PROTOCOL"] = handler.request_version
        client_address = handler.client_address
        if isinstance(client_address, tuple):
            env["REMOTE_ADDR"] = str(client_address[0])
            env["REMOTE_PORT"] = str(client_address[1])
        for name, value in handler.headers._headers:
            if "_" in name:
                continue  # gevent drops a header whose name has an underscore
            key = name.replace("-", "_").upper()
            if key in _UNCOPIED:
                continue
            key = "HTTP_" + key
            value = value.strip()
            if key in env:
                env[key] += ("; " if "COOKIE" in key else ",") + value
            else:
                env[key] = value
        sock = handler.socket if env.get("HTTP_EXPECT") == "100-continue" else None
        chunked = env.get("HTTP_TRANSFER_ENCODING", "").lower() == "chunked"
        upgrade = first.get("connection", "").lower() == "upgrade" or first.get("upgrade", "").lower() == "websocket"
        handler.wsgi_input = self._input(handler.rfile, handler.content_length, socket=sock, chunked_input=chunked)
        env["wsgi.input"] = handler.rfile if upgrade else handler.wsgi_input
        env["wsgi.input_terminated"] = not upgrade
        if self._gunicorns:
            env["gunicorn.sock"] = handler.socket
            env["RAW_URI"] = raw_path
        return env
