"""Request headers under gevent's own HTTP server, read without the email
package (``streamer_core.web.headers``): every block of header lines,
common or odd, gives the object gevent's own reading gives, from the same
bytes; the examples' gunicorn hooks give the process a handler that reads
them so, and an app behind it sees the environ it saw before."""

from __future__ import annotations

import io
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, List, Tuple

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

pytest.importorskip("gevent")
from gevent import pywsgi  # noqa: E402
from gunicorn.workers.ggevent import GeventPyWSGIWorker, PyWSGIHandler  # noqa: E402
from gunicorn.workers.gthread import ThreadWorker  # noqa: E402

from streamer_core.web.gunicorn import read_headers_quickly  # noqa: E402
from streamer_core.web.headers import quick_header_reading, quick_request_reading, read_headers  # noqa: E402
from tests.helpers import gunicorn_worker, needs_shortcut, wait_for  # noqa: E402
from tests.servers import free_port  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def outcome(read: Any, block: bytes) -> Tuple[Any, int]:
    """What reading ``block`` gives (the message's every field, its defects
    by kind and text; or the error), and how far it read."""
    fp = io.BytesIO(block)
    try:
        message = read(fp, 0)
    except Exception as exc:  # the same error, from the same line, either way
        return (type(exc), str(exc)), fp.tell()
    fields = dict(vars(message))
    fields["defects"] = [(type(d), str(d)) for d in fields.pop("defects")]
    return fields, fp.tell()


# Header lines of every shape the email package's parser tells apart: plain
# ones, names with spaces, colons, underscores or nothing, values with
# tabs, carriage returns and Latin-1, folded lines, the mbox "From " line,
# lines ended by CRLF, LF, a lone CR or nothing.
NAME = st.sampled_from(["Host", "Content-Type", "content-length", "X-Dup", "X_Under", "Bad Name", "", "é", "From"])
VALUE = st.text(alphabet=st.sampled_from("ab :\t\r\xe9;=,"), max_size=12)
END = st.sampled_from(["\r\n", "\r\n", "\n", "\r", ""])
LINE = st.one_of(
    st.builds(lambda n, v, e: f"{n}:{v}{e}", NAME, VALUE, END),
    st.builds(lambda n, v, e: f"{n}: {v}{e}", NAME, VALUE, END),
    st.builds(lambda v, e: f" {v}{e}", VALUE, END),  # a folded line
    st.builds(lambda v, e: f"From {v}{e}", VALUE, END),
    st.builds(lambda v, e: f"{v}{e}", VALUE, END),  # no colon, or just a value
)


@settings(max_examples=600, deadline=None)
@given(st.lists(LINE, max_size=8), st.sampled_from(["\r\n", "\n", "", "\r\nbody", "\r\n\r\nmore"]))
@example(["Host: a\r\n", "Content-Length: 5\r\n", "X-Dup: 1\r\n", "x-dup: 2\r\n"], "\r\nhello")
@example(["X-Fold: a\r\n", "  b\r\n"], "\r\n")
@example(["X-Cr: a\rb\r\n"], "\r\n")
@example([":no name\r\n"], "\r\n")
@example(["From someone\r\n", "Host: a\r\n"], "\r\n")
@example(["Host:   \r\n", "A:\tb  \r\n"], "\r\n")
def test_any_block_of_header_lines_reads_as_gevent_reads_it(lines: List[str], rest: str) -> None:
    block = ("".join(lines) + rest).encode("latin-1")
    assert outcome(read_headers, block) == outcome(pywsgi.headers_factory, block)


@pytest.mark.parametrize(
    "block",
    [
        b"A: " + b"x" * 70000 + b"\r\n\r\n",  # a line over http.client's limit
        b"A: " + b"x" * 65531 + b"\r\n\r\n",  # a line of exactly its limit, 65,536 bytes
        b"A: " + b"x" * 65532 + b"\r\n\r\n",  # one byte over
        b"".join(b"H%d: v\r\n" % n for n in range(101)) + b"\r\n",  # more headers than it takes
        b"".join(b"H%d: v\r\n" % n for n in range(99)) + b"\r\n",  # as many as it takes
        b"Host: a\r\nUser-Agent: x\r\n",  # the connection closed before the blank line
    ],
    ids=["line too long", "line at the limit", "line one over", "101 headers", "99 headers", "cut short"],
)
def test_the_limits_and_a_cut_block_read_as_gevent_reads_them(block: bytes) -> None:
    assert outcome(read_headers, block) == outcome(pywsgi.headers_factory, block)


def test_a_gevent_handler_reads_headers_quickly_and_others_keep_their_own() -> None:
    gevent_worker = gunicorn_worker(GeventPyWSGIWorker)
    read_headers_quickly(gevent_worker)
    assert issubclass(gevent_worker.wsgi_handler, PyWSGIHandler)
    assert gevent_worker.wsgi_handler.MessageClass is not PyWSGIHandler.MessageClass

    own = gunicorn_worker(GeventPyWSGIWorker)
    own.wsgi_handler = type("Own", (PyWSGIHandler,), {"MessageClass": lambda self, *args: None})
    before = own.wsgi_handler
    read_headers_quickly(own)
    assert own.wsgi_handler is before  # a handler that reads headers its own way

    threads = gunicorn_worker(ThreadWorker)
    read_headers_quickly(threads)
    assert not hasattr(threads, "wsgi_handler")  # gthread: no gevent handler


# -- the request line and the environ (quick_request_reading) --------------

#: The handler's socket, as the environ and the body's reader hold it.
SOCKET = object()


def quick_handler(handler: Any) -> Any:
    """``handler`` as the examples' gunicorn hooks leave it: headers read
    by read_headers, requests and environs by quick_request_reading."""
    reading = type(handler.__name__, (handler,), {"MessageClass": quick_header_reading(handler)})
    attributes = quick_request_reading(reading)
    assert attributes is not None
    return type(handler.__name__, (reading,), attributes)


class ServersEnviron:
    """What gevent's ``WSGIServer`` gives its handlers, its environ, by the
    server's own methods, without making a server: that would start a gevent
    hub in the pytest process, and every later wait of this process would
    go through it (tests/core/test_gevent_wait.py runs such waits apart)."""

    base_env = pywsgi.WSGIServer.base_env
    environ_class = dict
    ssl_enabled = False
    error_log = sys.stderr
    set_environ = pywsgi.WSGIServer.set_environ
    get_environ = pywsgi.WSGIServer.get_environ

    def __init__(self) -> None:
        self.set_environ({"SERVER_NAME": "localhost", "SERVER_PORT": "8000"})


def served_state(handler_class: Any, heads: List[bytes]) -> List[Any]:
    """What a handler of ``handler_class`` makes of ``heads``, sent one after
    another on one connection, step by step as gevent's
    ``handle_one_request`` takes them: for each, the handler's fields, the
    message of headers, the environ (its body reader by what it reads),
    or the error its reading raised; and how far it read."""
    server = ServersEnviron()
    rfile = io.BufferedReader(io.BytesIO(b"".join(heads)))  # type: ignore[arg-type]
    handler = handler_class(SOCKET, ("127.0.0.1", 5555), server, rfile=rfile)
    states: List[Any] = []
    for _ in heads:
        line = handler.read_requestline()
        if not line:
            break
        try:
            handler.read_request(line)
            environ = handler.get_environ()
        except Exception as exc:  # the same error, either way
            states.append(("error", type(exc), str(exc), rfile.tell()))
            break
        fields = {name: getattr(handler, name) for name in ("requestline", "command", "path", "request_version")}
        fields.update(length=handler.content_length, close=handler.close_connection, read=rfile.tell())
        message = dict(vars(handler.headers))
        message["defects"] = [(type(d), str(d)) for d in message.pop("defects")]
        body = environ.pop("wsgi.input")
        if body is rfile:
            body = "rfile"
        else:
            assert body is handler.wsgi_input
            body = (body.content_length, body.chunked_input, body.socket is SOCKET)
        environ["body"] = body
        environ["wsgi.errors"] = type(environ["wsgi.errors"])  # each state's own server's
        if "gunicorn.sock" in environ:
            environ["gunicorn.sock"] = environ["gunicorn.sock"] is SOCKET
        states.append((fields, message, environ))
    return states


REQUEST_LINE = st.one_of(
    st.builds(
        lambda method, path, version: f"{method} {path} {version}",
        st.sampled_from(["GET", "POST", "HEAD", "PUT"]),
        st.sampled_from(["/a", "/a%20b?x=1&y", "/\xe9t\xe9", "/p%C3%A9?q=%41", "/?", "*", "/a?b?c"]),
        st.sampled_from(["HTTP/1.1", "HTTP/1.0", "HTTP/0.9", "HTTP/2.0", "HTTP/1.x", "http/1.1", "HTTP/1.1.1"]),
    ),
    st.sampled_from(["GET /old", "POST /old", "GET", "GET / HTTP/1.1 extra", "  GET   /spaced   HTTP/1.1  "]),
)
# Headers the handler looks at, with values that change what it does, and
# the odd lines of LINE above.
LOOKED_AT = ["Content-Length", "content-length", "Transfer-Encoding", "Connection", "Upgrade", "Expect"]
LOOKED_AT += ["Content-Type", "Cookie", "X-Dup", "X_Under", "Host"]
TELLING = ["0", "5", "-1", " 7 ", "1_0", "x", "chunked", "Chunked", "close", "keep-alive", "Keep-Alive"]
TELLING += ["upgrade", "websocket", "100-continue", "a=1", "text/plain", ""]
HEADER = st.one_of(
    st.builds(lambda name, value: f"{name}: {value}\r\n", st.sampled_from(LOOKED_AT), st.sampled_from(TELLING)),
    LINE,
)
# A body's length given twice, by Transfer-Encoding and Content-Length: the
# coding in any case, padded, listed twice, beside others or alone; where a
# server and the app behind it disagree on which one wins, a second request
# can hide in the first one's body (request smuggling).
CODING = st.sampled_from(["chunked", "Chunked", "CHUNKED", "cHUNKED", "gzip, chunked", "chunked, gzip", "gzip"])
CODING_PAD = st.sampled_from([("", ""), (" ", ""), ("", " "), ("\t", "  "), ("  ", "\t")])
TRANSFER_ENCODING = st.builds(
    lambda name, pad, coding: f"{name}:{pad[0] or ' '}{coding}{pad[1]}\r\n",
    st.sampled_from(["Transfer-Encoding", "transfer-encoding", "TRANSFER-ENCODING"]),
    CODING_PAD,
    st.one_of(CODING, st.sampled_from(["identity", "x-chunked", "chunked;q=1", ""])),
)
CONTENT_LENGTH = st.builds(
    lambda name, value: f"{name}: {value}\r\n", st.sampled_from(["Content-Length", "content-length"]),
    st.sampled_from(["5", "0", " 7", "12"]),
)  # fmt: skip
BOTH_LENGTHS = st.builds(
    lambda codings, lengths, others: [*codings, *lengths, *others],
    st.lists(TRANSFER_ENCODING, min_size=1, max_size=2),
    st.lists(CONTENT_LENGTH, min_size=1, max_size=2),
    st.lists(HEADER, max_size=2),
).flatmap(st.permutations)
HEAD = st.builds(
    lambda line, end, headers: (line + end + "".join(headers) + "\r\n").encode("latin-1"),
    REQUEST_LINE,
    st.sampled_from(["\r\n", "\n"]),
    st.one_of(st.lists(HEADER, max_size=6), BOTH_LENGTHS),
)


@settings(max_examples=500, deadline=None)
@given(st.lists(HEAD, min_size=1, max_size=3))
@example([b"POST /s HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\nContent-Type: application/json\r\n\r\n"])
@example([b"POST /s HTTP/1.1\r\nTransfer-Encoding: chunked\r\nContent-Length: 5\r\n\r\n"])
@example([b"POST /s HTTP/1.1\r\nContent-Length: 5\r\nTransfer-Encoding: Chunked\r\n\r\n"])
@example([b"POST /s HTTP/1.1\r\nTransfer-Encoding: gzip, chunked\r\nContent-Length: 5\r\n\r\n"])
@example([b"GET /a HTTP/1.1\r\nCookie: a=1\r\nCookie: b=2\r\nX-Dup: 1\r\nx-dup: 2\r\n\r\n", b"GET /b\r\n"])
@example([b"GET /ws HTTP/1.1\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n"])
@example([b"PUT /e HTTP/1.0\r\nExpect: 100-continue\r\nConnection: keep-alive\r\nContent-Length: 3\r\n\r\n"])
@example([b"HEAD /h HTTP/1.1\r\nContent-Length: 4\r\n\r\n"])
@example([b"HEAD /h HTTP/1.1\r\nContent-Length: 0\r\n\r\n", b"GET /next HTTP/1.1\r\n\r\n"])
@example([b"GET /c HTTP/1.1\r\nConnection: close\r\nConnection: keep-alive\r\nContent-Length: 0\r\n\r\n"])
@example([b"POST /c HTTP/1.0\r\nConnection: keep-alive\r\nconnection: close\r\nContent-Length: 0\r\n\r\n"])
@example([b"GET /%C3%A9?q HTTP/1.1\r\nX-Fold: a\r\n  b\r\n\r\n"])
def test_any_request_reads_and_makes_the_environ_gevent_and_gunicorn_make(heads: List[bytes]) -> None:
    assert served_state(quick_handler(PyWSGIHandler), heads) == served_state(PyWSGIHandler, heads)
    assert served_state(quick_handler(pywsgi.WSGIHandler), heads) == served_state(pywsgi.WSGIHandler, heads)


#: Transfer-Encoding lines to put beside a Content-Length, and whether
#: gevent's handler drops the Content-Length for them (its first
#: Transfer-Encoding, lowered, is exactly "chunked").
BOTH = [
    ("Transfer-Encoding: chunked", True),
    ("Transfer-Encoding: Chunked", True),
    ("Transfer-Encoding: CHUNKED", True),
    ("transfer-encoding:   chunked", True),  # spaces before the value are not part of it
    ("Transfer-Encoding: chunked  ", False),  # after it, they are: gevent takes the length
    ("Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked", True),  # the first one counts
    ("Transfer-Encoding: gzip\r\nTransfer-Encoding: Chunked", False),
    ("Transfer-Encoding: gzip, chunked", False),
    ("Transfer-Encoding: chunked, gzip", False),
    ("Transfer-Encoding: x-chunked", False),
    ("Transfer-Encoding: identity", False),
]


@pytest.mark.parametrize("length_first", [False, True], ids=["length after", "length before"])
@pytest.mark.parametrize(("coding", "dropped"), BOTH, ids=[repr(coding) for coding, _ in BOTH])
def test_a_body_length_given_twice_reads_as_gevent_reads_it(coding: str, dropped: bool, length_first: bool) -> None:
    """Transfer-Encoding beside Content-Length, in any case, padded, listed
    twice or with another coding: the quick reading keeps or drops the
    Content-Length as gevent does, or the two would read a different body
    from the same bytes."""
    lines = [f"{coding}\r\n", "Content-Length: 5\r\n"]
    head = ("POST /s HTTP/1.1\r\nHost: a\r\n" + "".join(lines[::-1] if length_first else lines) + "\r\n").encode()
    for handler in (PyWSGIHandler, pywsgi.WSGIHandler):
        gevents = served_state(handler, [head])
        assert served_state(quick_handler(handler), [head]) == gevents
        fields, message, environ = gevents[0]
        if dropped:
            assert (fields["length"], "CONTENT_LENGTH" in environ) == (None, False)
            assert [name for name, _ in message["_headers"] if name.lower() == "content-length"] == []
        else:
            assert (fields["length"], environ["CONTENT_LENGTH"]) == (5, "5")


def test_a_handler_reading_requests_its_own_way_keeps_it() -> None:
    assert quick_request_reading(pywsgi.WSGIHandler) is not None
    assert quick_request_reading(PyWSGIHandler) is not None
    for name in ("read_request", "get_environ", "_headers", "_check_http_version", "_connection_upgrade_requested"):
        own = type("Own", (PyWSGIHandler,), {name: lambda self, *args: None})
        assert quick_request_reading(own) is None, name
    own_message = type("Own", (PyWSGIHandler,), {"MessageClass": lambda self, *args: None})
    assert quick_request_reading(own_message) is None  # headers read into another kind of message
    assert quick_request_reading(object) is None
    assert quick_request_reading(None) is None

    worker = gunicorn_worker(GeventPyWSGIWorker)
    read_headers_quickly(worker)
    handler = worker.wsgi_handler
    assert handler.read_request.__module__ == "streamer_core.web.headers"
    assert handler.get_environ.__module__ == "streamer_core.web.headers"


# A request with headers of every kind the environ shows: repeated, folded,
# with an underscore (dropped), with padding; and a body after them.
RAW = (
    b"POST /headers?q=1 HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Dup: a\r\nX-Dup: b\r\nX-Fold: first\r\n  second\r\n"
    b"X_Under: dropped\r\nX-Pad:   padded  \r\nCookie: a=1\r\nCookie: b=2\r\nContent-Type: text/plain\r\n"
    b"Content-Length: 5\r\nConnection: close\r\n\r\nhello"
)


def served_environ(conf: List[str], tmp_path: Path, name: str) -> Dict[str, Any]:
    """What ``tests.flask.warm_app`` sees of :data:`RAW` under a real
    gunicorn (gevent_pywsgi) started with ``conf``."""
    port = free_port()
    argv = [
        sys.executable, "-m", "gunicorn", *conf, "-k", "gevent_pywsgi", "-w", "1", "--bind", f"127.0.0.1:{port}",
        "tests.flask.warm_app:create_app()",
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(ROOT), "MARK_FOLDER": str(tmp_path), "PIN_WORKERS": "0"}
    with open(tmp_path / f"{name}.log", "wb") as out:
        server = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:

        def answer() -> Any:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
                    sock.sendall(RAW)
                    return b"".join(iter(lambda: sock.recv(65536), b""))
            except OSError:
                return None

        reply = wait_for(answer, 90)
        assert reply, (tmp_path / f"{name}.log").read_text()
        head, _, body = reply.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200"), reply
        import json

        seen: Dict[str, Any] = json.loads(body)
        return seen
    finally:
        os.killpg(server.pid, signal.SIGKILL)
        server.wait(10)


@needs_shortcut("gevent-reading")
def test_an_app_behind_the_examples_gunicorn_sees_the_environ_gevent_gives(tmp_path: Path) -> None:
    ours = served_environ(["-c", "example_flask/gunicorn.conf.py"], tmp_path, "ours")
    plain = served_environ([], tmp_path, "plain")
    assert ours["reader"] == "streamer_core.web.headers"
    assert plain["reader"] == "gevent.pywsgi"
    assert (ours["request_reader"], plain["request_reader"]) == ("streamer_core.web.headers", "gevent.pywsgi")
    assert ours["environ"] == plain["environ"]
    seen = ours["environ"]
    assert seen["HTTP_X_DUP"] == "a,b" and seen["HTTP_COOKIE"] == "a=1; b=2"
    assert seen["HTTP_X_FOLD"].startswith("first") and seen["HTTP_X_FOLD"].endswith("second")
    assert "HTTP_X_UNDER" not in seen and seen["HTTP_X_PAD"] == "padded"
    assert (seen["CONTENT_TYPE"], seen["CONTENT_LENGTH"], seen["body"]) == ("text/plain", "5", "hello")
    assert (seen["PATH_INFO"], seen["QUERY_STRING"], seen["RAW_URI"]) == ("/headers", "q=1", "/headers?q=1")
    assert seen["gunicorn.sock"] and seen["wsgi.input_terminated"] is True
