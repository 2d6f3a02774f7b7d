"""Responses under gevent's own HTTP server written in one ``send``
(``streamer_core.web.writing``): every kind of response reaches the client
byte for byte as gevent writes it, with the same log line; one whose body
fits goes out in one call; what a call leaves unsent still arrives; and the
examples' gunicorn hooks give the process a handler that writes so."""

from __future__ import annotations

import socket
import struct
import threading
import time
from typing import Any, Callable, Dict, List, Tuple

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("gevent")
import gevent  # noqa: E402
from gevent import pywsgi  # noqa: E402
from gunicorn.workers.ggevent import GeventPyWSGIWorker, PyWSGIHandler  # noqa: E402
from gunicorn.workers.gthread import ThreadWorker  # noqa: E402

from streamer_core.web import writing  # noqa: E402
from streamer_core.web.gunicorn import write_in_one_send  # noqa: E402
from streamer_core.web.writing import JOINED_BODY_MOST, one_send_writing  # noqa: E402
from tests.helpers import gunicorn_worker  # noqa: E402


class Counted:
    """A server's socket, counted: what it was asked to send, and how; every
    call goes on to the socket itself."""

    def __init__(self, sock: Any, calls: List[Tuple[str, int, int]], sndbuf: int) -> None:
        self._real = sock
        self._calls = calls
        if sndbuf:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, sndbuf)

    def send(self, data: Any, *args: Any) -> int:
        sent: int = self._real.send(data, *args)
        self._calls.append(("send", len(data), sent))
        return sent

    def sendall(self, data: Any, *args: Any) -> None:
        self._calls.append(("sendall", len(data), len(data)))
        self._real.sendall(data, *args)

    def getsockopt(self, *args: Any) -> Any:
        self._calls.append(("getsockopt", 0, 0))
        return self._real.getsockopt(*args)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)


class Served:
    """gevent's WSGI server on 127.0.0.1, in a thread of its own (its own
    hub), serving ``app`` with ``handler`` (gevent's, or the one-send one);
    each request's log line fields and socket calls are kept."""

    def __init__(self, app: Callable[..., Any], one_send: bool, sndbuf: int = 0) -> None:
        self.logged: List[Tuple[int, str, int]] = []
        self.calls: List[Tuple[str, int, int]] = []
        served = self
        base: Any = pywsgi.WSGIHandler
        if one_send:
            attributes = one_send_writing(pywsgi.WSGIHandler)
            assert attributes is not None
            base = type("OneSend", (pywsgi.WSGIHandler,), attributes)

        class Handler(base):  # type: ignore[misc]
            def __init__(self, sock: Any, *args: Any, **kwargs: Any) -> None:
                super().__init__(Counted(sock, served.calls, sndbuf), *args, **kwargs)

            def log_request(self) -> None:
                served.logged.append((self.code, str(self.status), self.response_length))

        self._stop = threading.Event()
        self._ready = threading.Event()
        self._app, self._handler = app, Handler
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()
        assert self._ready.wait(10)

    def _serve(self) -> None:
        server = pywsgi.WSGIServer(("127.0.0.1", 0), self._app, handler_class=self._handler, log=None, error_log=None)
        server.start()
        self.port = server.server_port
        self._ready.set()
        while not self._stop.is_set():
            gevent.sleep(0.01)
        server.stop(timeout=1)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(10)


BIG = b"b" * (JOINED_BODY_MOST + 1)
OWN_DATE = "Tue, 01 Jan 2030 00:00:00 GMT"
DRIPS = 20
DRIPPED: List[int] = []  # one a chunk /drip handed over


def app(environ: Dict[str, Any], start_response: Callable[..., Any]) -> Any:
    """Responses of every shape gevent writes apart, by path."""
    path = environ["PATH_INFO"]
    if path == "/sleep":  # answers after the client has gone
        gevent.sleep(0.3)
        path = "/small"
    bodies: Dict[str, List[bytes]] = {
        "/small": [b'{"x": [0.125, 0.25]}' * 300],
        "/at-most": [b"m" * JOINED_BODY_MOST],
        "/big": [BIG],
        "/parts": [b"one,", b"", b"two,", b"three"],
        "/empty": [],
        "/no-content": [],
    }
    if path == "/drip":  # chunks a while apart, each counted as the app hands it over
        start_response("200 OK", [("Content-Type", "text/plain"), ("Content-Length", str(DRIPS * 1000))])

        def drip() -> Any:
            for _ in range(DRIPS):
                DRIPPED.append(1)
                yield b"d" * 1000
                gevent.sleep(0.1)

        return drip()
    if path == "/write":  # the write() callable of start_response, then the iterable
        write = start_response("200 OK", [("Content-Type", "text/plain"), ("Content-Length", "11")])
        write(b"written ")
        return [b"too"]
    if path == "/dated":  # the application's own Date
        start_response("200 OK", [("Content-Type", "text/plain"), ("Content-Length", "2"), ("Date", OWN_DATE)])
        return [b"ok"]
    if path == "/stream":  # no length: chunked for HTTP/1.1
        start_response("200 OK", [("Content-Type", "text/plain")])
        return iter([b"first ", b"second"])
    body = bodies[path]
    status = "204 No Content" if path == "/no-content" else "200 OK"
    headers = [("Content-Type", "application/json")]
    if path != "/no-content":
        headers.append(("Content-Length", str(sum(len(part) for part in body))))
    start_response(status, headers)
    return body


def exchange(port: int, raw: bytes, rcvbuf: int = 0, read_after: float = 0.0, dated: bool = False) -> bytes:
    """Send ``raw`` (whole requests, the last saying ``Connection: close``)
    and read until the server closes; the ``Date`` headers left out, unless ``dated``."""
    with socket.socket() as sock:
        if rcvbuf:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        sock.settimeout(10)
        sock.connect(("127.0.0.1", port))
        sock.sendall(raw)
        time.sleep(read_after)
        got = b"".join(iter(lambda: sock.recv(65536), b""))
    if dated:
        return got
    return b"\r\n".join(line for line in got.split(b"\r\n") if not line.startswith(b"Date: "))


def request(path: str, method: str = "GET", version: str = "HTTP/1.1", close: bool = False) -> bytes:
    lines = [f"{method} {path} {version}", "Host: t"] + (["Connection: close"] if close else [])
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


PATHS = ["/small", "/at-most", "/big", "/parts", "/empty", "/no-content", "/write", "/stream"]


@pytest.mark.parametrize("version", ["HTTP/1.1", "HTTP/1.0"])
def test_every_kind_of_response_arrives_as_gevent_writes_it(version: str) -> None:
    if version == "HTTP/1.1":  # one connection, kept alive
        raws = [b"".join(request(path) for path in PATHS) + request("/small", "HEAD") + request("/small", close=True)]
    else:  # a connection a request
        raws = [request(path, version=version) for path in PATHS + ["/small"]]
    seen = []
    for one_send in (False, True):
        served = Served(app, one_send)
        try:
            seen.append(([exchange(served.port, raw) for raw in raws], served.logged))
        finally:
            served.close()
    (gevents, gevent_logged), (ours, our_logged) = seen
    assert ours == gevents
    assert our_logged == gevent_logged  # status, and the bytes each response took, for the log line
    assert len(our_logged) == len(PATHS) + (2 if version == "HTTP/1.1" else 1)
    assert b"Transfer-Encoding: chunked" in ours[0] if version == "HTTP/1.1" else b"second" in ours[-2]


def test_a_response_whose_body_fits_goes_out_in_one_send() -> None:
    served = Served(app, one_send=True)
    try:
        for path, calls in [("/small", 1), ("/at-most", 1), ("/write", 2), ("/big", 2)]:
            served.calls.clear()
            answer = exchange(served.port, request(path, close=True))
            assert answer.startswith(b"HTTP/1.1 200 OK"), answer[:200]
            sends = [call for call in served.calls if call[0] == "send"]
            assert len(sends) == calls, (path, served.calls)
            if calls == 1:  # headers and body together, and nothing asked of the socket besides
                assert served.calls == sends and sends[0][1] == len(answer) + len(b"Date: ") + 29 + 2
    finally:
        served.close()


def test_what_one_send_leaves_unsent_still_arrives() -> None:
    answers = []
    for one_send in (False, True):
        served = Served(app, one_send, sndbuf=4096)
        try:
            answers.append(exchange(served.port, request("/at-most", close=True), rcvbuf=4096, read_after=0.3))
            if one_send:
                first = next(call for call in served.calls if call[0] == "send")
                assert first[2] < first[1], served.calls  # the socket took part of it: the rest went after
        finally:
            served.close()
    assert answers[1] == answers[0] and answers[1].endswith(b"m" * JOINED_BODY_MOST)


def test_a_client_gone_is_logged_as_gevent_logs_it() -> None:
    logged = []
    for one_send in (False, True):
        served = Served(app, one_send)
        try:
            with socket.socket() as sock:
                sock.connect(("127.0.0.1", served.port))
                sock.sendall(request("/sleep"))
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # reset, not FIN
            deadline = time.monotonic() + 10
            while not served.logged and time.monotonic() < deadline:
                time.sleep(0.02)
            logged.append(served.logged[:1])
        finally:
            served.close()
    assert logged[0] and logged[1] == logged[0]
    code, status, _ = logged[1][0]
    assert code == -200 and status.startswith("socket error: ")


def test_a_client_gone_mid_response_stops_the_app_as_gevent_stops_it() -> None:
    """A write that fails ends the response: the app's iterable is not
    drained into a closed socket, the log line says what gevent's says."""
    seen = []
    for one_send in (False, True):
        served = Served(app, one_send)
        DRIPPED.clear()
        try:
            with socket.socket() as sock:
                sock.connect(("127.0.0.1", served.port))
                sock.sendall(request("/drip"))
                assert sock.recv(65536).startswith(b"HTTP/1.1 200 OK")
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # reset, not FIN
            deadline = time.monotonic() + 10
            while not served.logged and time.monotonic() < deadline:
                time.sleep(0.02)
            time.sleep(0.3)  # long enough for three more chunks, had the app gone on
            seen.append((len(DRIPPED), served.logged[:1]))
        finally:
            served.close()
    (gevent_drips, gevent_logged), (drips, logged) = seen
    assert drips < DRIPS and drips <= gevent_drips + 1, (drips, gevent_drips)
    assert logged and logged[0][:2] == gevent_logged[0][:2] and logged[0][0] < 0


def test_every_response_is_dated_once_as_gevent_dates_it() -> None:
    """The one-send handler formats the ``Date`` once a second, not once a
    response: each response still carries one, of the second it was
    written in, as gevent writes it; an application's own is kept alone."""
    served = Served(app, one_send=True)
    try:
        before = time.time()
        got = exchange(
            served.port, b"".join(request(path) for path in PATHS) + request("/dated", close=True), dated=True
        )
        after = time.time()
    finally:
        served.close()
    dates = [line[len(b"Date: ") :] for line in got.split(b"\r\n") if line.startswith(b"Date: ")]
    assert len(dates) == len(PATHS) + 1, got[:500]
    assert dates[-1] == OWN_DATE.encode()
    seconds = {pywsgi.format_date_time(second) for second in range(int(before), int(after) + 1)}
    assert set(dates[:-1]) <= seconds, (dates, seconds)


@settings(max_examples=300, deadline=None)
@given(st.floats(min_value=0, max_value=2**33, allow_nan=False))
def test_a_date_is_formatted_as_gevent_formats_it(now: float) -> None:
    assert writing.http_date(now) == pywsgi.format_date_time(now)


def test_a_gevent_handler_writes_in_one_send_and_others_keep_their_own() -> None:
    gevent_worker = gunicorn_worker(GeventPyWSGIWorker)
    write_in_one_send(gevent_worker)
    assert issubclass(gevent_worker.wsgi_handler, PyWSGIHandler)
    assert gevent_worker.wsgi_handler._sendall is writing._sendall

    assert gevent_worker.wsgi_handler.finalize_headers is writing._finalize_headers

    own = gunicorn_worker(GeventPyWSGIWorker)
    own.wsgi_handler = type("Own", (PyWSGIHandler,), {"_write": lambda self, data: None})
    before = own.wsgi_handler
    write_in_one_send(own)
    assert own.wsgi_handler is before  # a handler that writes its own way

    def finalize(handler: Any) -> None:
        pywsgi.WSGIHandler.finalize_headers(handler)

    dating = gunicorn_worker(GeventPyWSGIWorker)
    dating.wsgi_handler = type("OwnHeaders", (PyWSGIHandler,), {"finalize_headers": finalize})
    write_in_one_send(dating)
    assert dating.wsgi_handler._sendall is writing._sendall  # written in one send
    assert dating.wsgi_handler.finalize_headers is finalize  # and its headers finished its own way

    threads = gunicorn_worker(ThreadWorker)
    write_in_one_send(threads)
    assert not hasattr(threads, "wsgi_handler")  # gthread: no gevent handler
