"""Requests whose framing is ambiguous or malformed (the stuff of request
smuggling: a Content-Length beside a Transfer-Encoding, two lengths, a
chunk size that is not one, an obsolete folded line, a line that is not a
header) answered, over a real socket, exactly as the server's own parser
answers them: under gevent's server with the examples' gunicorn hooks, the
quick request reading of :mod:`streamer_core.web.headers` gives byte for
byte what gevent's own reading gives (``STREAMER_SHORTCUTS=0``); under
gunicorn's own parser (gthread) the hooks change nothing.

Each case is sent with a second request after it on the same connection:
what a smuggled request would ride on."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import Dict, Iterator, List, Tuple

import pytest

from tests.helpers import ROOT, wait_for
from tests.servers import free_port

pytest.importorskip("gevent")

FOLLOWER = b"POST /raw HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok"

# name -> the head and body sent before FOLLOWER.
CASES: Dict[str, bytes] = {
    "length and chunked": b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 4\r\n"
    b'Transfer-Encoding: chunked\r\n\r\n3\r\n"a"\r\n0\r\n\r\n',
    "chunked then length": b"POST /raw HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nContent-Length: 40\r\n\r\n"
    b"2\r\nhi\r\n0\r\n\r\n",
    "Chunked, capitalised": b"POST /raw HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\nTransfer-Encoding: Chunked\r\n\r\n"
    b"2\r\nhi\r\n0\r\n\r\n",
    "CHUNKED": b"POST /raw HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\nTransfer-Encoding: CHUNKED\r\n\r\n"
    b"2\r\nhi\r\n0\r\n\r\n",
    "chunked with spaces": b"POST /raw HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\nTransfer-Encoding:  chunked \r\n\r\n"
    b"2\r\nhi\r\n0\r\n\r\n",
    "chunked listed twice": b"POST /raw HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n"
    b"Transfer-Encoding: chunked\r\n\r\n2\r\nhi\r\n0\r\n\r\n",
    "chunked, chunked": b"POST /raw HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n"
    b"Transfer-Encoding: chunked, chunked\r\n\r\n2\r\nhi\r\n0\r\n\r\n",
    "gzip, chunked": b"POST /raw HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\nTransfer-Encoding: gzip, chunked\r\n\r\n"
    b"2\r\nhi\r\n0\r\n\r\n",
    "another coding": b"POST /raw HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\nTransfer-Encoding: identity\r\n\r\nabc",
    "two lengths, the same": b"POST /raw HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\nContent-Length: 3\r\n\r\nabc",
    "two lengths, different": b"POST /raw HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\nContent-Length: 5\r\n\r\nabcde",
    "a length with a sign": b"POST /raw HTTP/1.1\r\nHost: x\r\nContent-Length: +3\r\n\r\nabc",
    "a negative length": b"POST /raw HTTP/1.1\r\nHost: x\r\nContent-Length: -3\r\n\r\nabc",
    "a bad chunk size": b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
    b'Transfer-Encoding: chunked\r\n\r\nzz\r\n"a"\r\n0\r\n\r\n',
    "a chunk size with a sign": b"POST /raw HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
    b"+2\r\nhi\r\n0\r\n\r\n",
    "a folded line": b"POST /raw HTTP/1.1\r\nHost: x\r\nX-Folded: a\r\n b\r\nContent-Length: 3\r\n\r\nabc",
    "a folded length": b"POST /raw HTTP/1.1\r\nHost: x\r\nContent-Length:\r\n 3\r\n\r\nabc",
    "a line without a colon": b"POST /raw HTTP/1.1\r\nHost: x\r\nNo colon here\r\nContent-Length: 3\r\n\r\nabc",
    "a space before the colon": b"POST /raw HTTP/1.1\r\nHost: x\r\nContent-Length : 3\r\n\r\nabc",
    "a bare LF": b"POST /raw HTTP/1.1\nHost: x\nContent-Length: 3\n\nabc",
}


def _start(worker: str, conf: List[str], env: Dict[str, str], log: Path) -> Tuple[subprocess.Popen[bytes], int]:
    port = free_port()
    argv = [
        sys.executable, "-m", "gunicorn", *conf, "-k", worker, "-w", "1", "--threads", "2",
        "--bind", f"127.0.0.1:{port}", "tests.flask.echo_app:create_app()",
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PIN_WORKERS": "0", **env}
    with open(log, "wb") as out:
        server = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    return server, port


def _exchange(port: int, data: bytes) -> bytes:
    """Everything the server sends back for ``data`` until it closes (or 3 s
    of silence), with what differs from one run to the next left out: the
    ``Date``, and the order of the methods an ``Allow`` lists (werkzeug's
    set of them)."""
    with socket.create_connection(("127.0.0.1", port), timeout=3) as sock:
        sock.sendall(data)
        got = b""
        try:
            for piece in iter(lambda: sock.recv(65536), b""):
                got += piece
        except (TimeoutError, ConnectionResetError):
            pass
    got = re.sub(rb"(?im)^date: [^\r\n]*\r\n", b"", got)
    return re.sub(rb"(?im)^(allow: )([^\r\n]*)", lambda m: m[1] + b", ".join(sorted(m[2].split(b", "))), got)


def _answered(port: int) -> bytes:
    try:
        return _exchange(port, FOLLOWER)
    except OSError:
        return b""  # not listening yet


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Dict[str, int]]:
    folder = tmp_path_factory.mktemp("smuggling")
    conf = ["-c", "example_flask/gunicorn.conf.py"]
    kinds = {
        "gevent, shortcuts": ("gevent_pywsgi", conf, {}),
        "gevent, its own": ("gevent_pywsgi", conf, {"STREAMER_SHORTCUTS": "0"}),
        "gthread, the hooks": ("gthread", conf, {}),
        "gthread, plain": ("gthread", [], {}),
    }
    started: Dict[str, Tuple[subprocess.Popen[bytes], int]] = {}
    try:
        for name, (worker, argv, env) in kinds.items():
            started[name] = _start(worker, argv, env, folder / f"{name}.log")
        for name, (_, port) in started.items():
            up = wait_for(lambda port=port: b" 200 " in _answered(port), 60, interval=0.2)
            assert up, (folder / f"{name}.log").read_text()
        yield {name: port for name, (_, port) in started.items()}
    finally:
        for server, _ in started.values():
            try:
                os.killpg(server.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            server.wait(10)


def test_the_servers_read_requests_as_they_are_told(servers: Dict[str, int]) -> None:
    # The shortcut's reading is in place where it is meant to be, and only there.
    for name, port in servers.items():
        reply = _exchange(port, FOLLOWER)
        assert reply.startswith(b"HTTP/1.1 200") and b'"body":"ok"' in reply, (name, reply)


@pytest.mark.parametrize("case", list(CASES))
def test_an_ambiguous_request_is_answered_as_the_servers_own_parser_answers_it(
    servers: Dict[str, int], case: str
) -> None:
    sent = CASES[case] + FOLLOWER
    ours, gevents = _exchange(servers["gevent, shortcuts"], sent), _exchange(servers["gevent, its own"], sent)
    assert ours == gevents, f"{case}:\n{ours!r}\n!=\n{gevents!r}"
    hooked, plain = _exchange(servers["gthread, the hooks"], sent), _exchange(servers["gthread, plain"], sent)
    assert hooked == plain, f"{case}:\n{hooked!r}\n!=\n{plain!r}"
    assert ours and hooked, "every case gets an answer"
