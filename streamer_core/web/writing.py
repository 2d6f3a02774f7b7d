"""Responses of gevent's HTTP server (gunicorn's ``-k gevent_pywsgi``, the
examples' worker class) written in one system call where they fit.

gevent's ``WSGIHandler`` writes a response's status line and headers with
one ``sendall`` and its body with another, and each ``sendall`` of a gevent
socket asks the kernel for the socket's send buffer size first
(``getsockopt``) to cut large data into chunks: four system calls and two
TCP segments for a response of a few kilobytes, an embedding's JSON say,
and on loopback or a fast network the kernel's work for each ``send`` is
about what the rest of the response costs. :func:`one_send_writing` gives
a handler class whose header block waits for the body that follows it when
that body is at most :data:`JOINED_BODY_MOST` bytes, and goes out with it
in one ``send``; a body larger than that is sent as gevent sends it (copying
it into the header block would cost more than the call it saves), and so
is whatever one ``send`` leaves unsent. A response with no body (a 204,
``HEAD``, an empty iterable) flushes its headers as gevent does.

The same handler dates its responses from a ``Date`` value made once a
second, where gevent formats the time for each response (``time.gmtime``
and a ``%`` format: a percent of a stubbed request's CPU).
"""

from __future__ import annotations

import time
from email.utils import formatdate
from typing import Any, Dict, List, Optional, Tuple

__all__ = ["JOINED_BODY_MOST", "http_date", "one_send_writing"]

#: The largest body, in bytes, sent in one ``send`` with its headers.
JOINED_BODY_MOST = 65536


class _Hold:
    """A handler's mark: the next block written (the header block) waits for the body."""


_HOLD = _Hold()
# gevent's WSGIHandler, set by one_send_writing before any handler writes.
_GEVENT: List[Any] = []


def _write_with_headers(handler: Any, data: bytes) -> None:
    base = _base()
    if not data or len(data) > JOINED_BODY_MOST:
        base._write_with_headers(handler, data)
        return
    handler._held = _HOLD  # gevent writes the header block, then the body: the first waits for the second
    try:
        base._write_with_headers(handler, data)
    finally:
        handler._held = None  # sent with the body; or, where gevent raised before either, nothing to hold


def _sendall(handler: Any, data: Any) -> None:
    held = handler._held
    if held is _HOLD:
        handler._held = data  # the header block (gevent's own bytearray, not used again): sent with the body
        return
    if held is not None:
        handler._held = None
        held += data
        data = held
    try:
        sent = handler.socket.send(data)
    except OSError as exc:  # recorded as gevent records it, for its log line
        handler.status = f"socket error: {exc}"
        if handler.code > 0:
            handler.code = -handler.code
        raise
    handler.response_length += sent
    if sent < len(data):
        _base()._sendall(handler, memoryview(data)[sent:])


# The second last formatted, and its Date value.
_dated: Tuple[int, bytes] = (-1, b"")


def http_date(now: float) -> bytes:
    """The ``Date`` header's value for the time ``now`` (seconds since the
    epoch), as gevent writes it (RFC 9110's IMF-fixdate), formatted once a second."""
    global _dated
    second = int(now)
    dated = _dated  # one read: another thread may replace it meanwhile
    if dated[0] == second:
        return dated[1]
    value = formatdate(second, usegmt=True).encode("latin-1")  # English names, whatever the locale
    _dated = (second, value)
    return value


def _finalize_headers(handler: Any) -> None:
    if handler.provided_date is None:  # the application gave no Date: the one of this second
        handler.response_headers.append((b"Date", http_date(time.time())))
        handler.provided_date = True  # as if given: gevent adds none (start_response clears it for the next)
    _base().finalize_headers(handler)


def _base() -> Any:
    """gevent's handler class, whose methods these wrap (looked up when
    :func:`one_send_writing` gave them out, not by an import per response)."""
    return _GEVENT[0]


def one_send_writing(handler: Any) -> Optional[Dict[str, Any]]:
    """For a handler class of gevent's HTTP server that writes responses as
    gevent does, the attributes of a subclass that writes each one whose
    body is at most :data:`JOINED_BODY_MOST` bytes in one ``send``; ``None``
    for any other (one that writes its own way, another server's, a gevent
    without these methods)."""
    try:
        from gevent import pywsgi
    except ImportError:
        return None
    if not (isinstance(handler, type) and issubclass(handler, pywsgi.WSGIHandler)):
        return None
    for name in ("_write_with_headers", "_sendall", "_write"):
        if getattr(handler, name, None) is not getattr(pywsgi.WSGIHandler, name, handler):
            return None
    _GEVENT[:] = [pywsgi.WSGIHandler]
    attributes: Dict[str, Any] = {"_write_with_headers": _write_with_headers, "_sendall": _sendall, "_held": None}
    if getattr(handler, "finalize_headers", None) is getattr(pywsgi.WSGIHandler, "finalize_headers", handler):
        attributes["finalize_headers"] = _finalize_headers  # a handler that finishes headers its own way keeps it
    return attributes
