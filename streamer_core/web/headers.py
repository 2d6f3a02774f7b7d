"""Request headers for gevent's HTTP server (gunicorn's ``-k gevent_pywsgi``,
the examples' worker class), read without the email package's parser.

gevent's ``WSGIHandler`` reads a request's headers with
``http.client.parse_headers``, which joins the lines and hands them to the
``email`` package's parser: 166,000 instructions for three headers, of the
1.43 million a request with the forward pass stubbed costs the example's
web process (bench/README.md, "Reading request headers without the e-mail
parser"); 54,000 read here. Almost every request's
headers are lines of ``Name: value``. :func:`read_headers` reads the lines
as ``http.client`` does (the same limits on a line's length and on their
number) and, where every one has that shape, stores each in gevent's own
message class as the parser would (``set_raw``, the value as the parser
cuts it); any other block (a folded line, a line that is not a header, a
lone carriage return inside one) goes to the parser itself. Either way
the handler gets the same object, field for field, for every block.
"""

from __future__ import annotations

import re
from http import client
from typing import Any, BinaryIO, List

__all__ = ["read_headers", "quick_header_reading"]

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
