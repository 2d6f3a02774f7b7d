"""Small helpers the test packages share."""

from __future__ import annotations

import functools
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable, Dict, Iterable, Optional, Tuple

ROOT = Path(__file__).resolve().parents[1]


def failure_behind(error: Dict[str, Any], records: Any) -> BaseException:
    """The exception behind a 500 answered as the project answers one by
    default (``error``: its JSON error, ``internal error`` and an id, the
    index of the input where a request has many): the one logged, with its
    traceback, on the record that names the same id (``records``: pytest's
    ``caplog.records``)."""
    assert error["status"] == 500 and error["type"] == "internal_error", error
    assert error["message"].endswith("internal error") and "traceback" not in error, error
    assert len(error["id"]) == 16, error
    logged = [record for record in records if error["id"] in record.getMessage()]
    assert len(logged) == 1 and logged[0].exc_info, [record.getMessage() for record in records]
    failure: BaseException = logged[0].exc_info[1]
    return failure


def shortcut_on(name: str) -> bool:
    """Whether the shortcut ``name`` is taken in this test run
    (:mod:`streamer_core.shortcuts`: ``STREAMER_SHORTCUTS=0`` runs the
    suite on the public paths; a package's release outside its range too)."""
    from streamer_core import shortcuts

    return shortcuts.allowed(name)


def needs_shortcut(name: str, switch: bool = True) -> Any:
    """Mark a test of what the shortcut ``name`` does: skipped, with the
    reason, where it is off. ``switch=False``: a test that takes the
    shortcut's code by hand, whatever the switch says, skipped only where
    the installed release is not one it is tested on."""
    import pytest

    from streamer_core import shortcuts

    why = shortcuts.problem(name) if switch else shortcuts.release_problem(name)
    return pytest.mark.skipif(why is not None, reason=f"the {name} shortcut is off: {why}")


def wait_for(predicate: Callable[[], Any], seconds: float, interval: float = 0.02) -> Any:
    """Poll ``predicate`` until it is truthy or ``seconds`` pass; return its last value."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    return predicate()


def alive(pid: int) -> bool:
    """Whether process ``pid`` runs (a zombie counts as dead)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def beating_workers(redis_url: str, prefix: str) -> int:
    """How many workers beat in the presence sets under ``streamer:<prefix>``
    (any model): a worker beats once its model has loaded."""
    import redis

    conn = redis.Redis.from_url(redis_url, socket_timeout=5)
    try:
        keys = list(conn.scan_iter(match=f"streamer:{prefix}*:workers", count=1000))
        return sum(int(conn.zcard(key)) for key in keys)
    finally:
        conn.close()


def metric_samples(text: str) -> Dict[Tuple[str, Tuple[Tuple[str, str], ...]], float]:
    """Prometheus's text format as ``{(sample name, sorted labels): value}``."""
    from prometheus_client.parser import text_string_to_metric_families

    found = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            found[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return found


def post_chunked(
    port: int,
    path: str,
    body: bytes,
    content_type: str,
    chunk: int = 64 * 1024,
    timeout: float = 30.0,
    end: bool = True,
) -> Tuple[int, Dict[str, str], Any]:
    """``POST path`` on 127.0.0.1 with ``body`` sent in chunks
    (``Transfer-Encoding: chunked``, no ``Content-Length``), as a client
    streaming an upload does: (status, headers, the JSON body or the text).
    A server may answer (a 413) and close before it has read the whole
    body: the sending then stops, and its answer is read. ``end=False``
    never sends the last chunk, as a client still sending: only a server
    that answers before the body's end answers within ``timeout`` seconds."""
    import http.client
    import json
    import socket

    sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    try:
        head = (
            f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: {content_type}\r\n"
            "Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
        )
        try:
            sock.sendall(head.encode())
            for i in range(0, len(body), chunk):
                piece = body[i : i + chunk]
                sock.sendall(f"{len(piece):x}\r\n".encode() + piece + b"\r\n")
            if end:
                sock.sendall(b"0\r\n\r\n")
        except (BrokenPipeError, ConnectionResetError):
            pass  # answered before the body was all sent
        response = http.client.HTTPResponse(sock)
        response.begin()
        data = response.read()
        headers = {name.lower(): value for name, value in response.getheaders()}
    finally:
        sock.close()
    try:
        return response.status, headers, json.loads(data)
    except ValueError:
        return response.status, headers, data.decode(errors="replace")


def post_and_leave(port: int, path: str, payload: Any, stay_s: float = 0.3) -> None:
    """A client that gives up: ``POST path`` with a JSON body to
    ``127.0.0.1:port``, wait ``stay_s`` seconds without reading the answer,
    and close the connection."""
    import json

    body = json.dumps(payload).encode()
    post_raw(port, path, f"Content-Length: {len(body)}\r\n", body, leave=True, stay_s=stay_s)


#: A body cut short: the client sends the head and these bytes, then leaves.
CUT_BODIES = {
    "content-length": ("Content-Length: 100\r\n", b'{"s": "hel'),
    "chunked": ("Transfer-Encoding: chunked\r\n", b'a\r\n{"s": "hel'),
}


def post_raw(port: int, path: str, head: str, body: bytes, leave: bool = False, stay_s: float = 0.3) -> bytes:
    """``POST path`` to ``127.0.0.1:port`` as raw bytes: the JSON content
    type, the header lines ``head`` (each ending in CRLF), then ``body``.
    ``leave``: close the connection ``stay_s`` seconds later without reading
    (a client that gives up, mid-body or waiting; ``b""``); else the whole
    response, the server closing the connection after it."""
    import socket

    request = (
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n"
        f"Connection: close\r\n{head}\r\n"
    ).encode()
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(request + body)
        if leave:
            time.sleep(stay_s)
            return b""
        response = b""
        while chunk := sock.recv(65536):
            response += chunk
        return response


def run_program(script: Path, *args: str, timeout: float) -> subprocess.CompletedProcess[str]:
    """Run the Python program ``script`` (with ``args``) from the repository's
    root, the project importable, its output captured as text. A program
    still running after ``timeout`` seconds fails the test as hung, with what
    it printed so far."""
    try:
        return subprocess.run(
            [sys.executable, str(script), *args],
            cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
            capture_output=True,
            text=True,
            timeout=timeout,
        )
    except subprocess.TimeoutExpired as exc:
        raise AssertionError(f"the program hung: {exc.stdout!r} {exc.stderr!r}") from None


def hold_answers(monkeypatch: Any, module: Any, seconds: float) -> None:
    """Make the backend ``module`` hold each batch's answers ``seconds``
    before it hands them to their calls (its ``deliver``), as a loaded
    machine may: what a test of the time between a batch's end and its
    answers' arrival needs."""
    handed = module.deliver

    def slowly(items: Any, outcomes: Any) -> None:
        time.sleep(seconds)
        handed(items, outcomes)

    monkeypatch.setattr(module, "deliver", slowly)


def close_answers_every_call(streamer: Any, calls: int = 6) -> None:
    """Call ``streamer`` (a model doubling its inputs) once, send ``calls``
    more and close it at once: every call gets its answer, and close()
    returns well before its 30 s timeout."""
    try:
        assert streamer.predict([1]) == [2]
        futures = [streamer.submit([x]) for x in range(calls)]
    finally:
        started = time.monotonic()
        streamer.close(timeout=30)
    assert [f.result(0) for f in futures] == [[x * 2] for x in range(calls)]
    assert time.monotonic() - started < 10.0, "close() waits for the answers in hand, then no longer"


def gunicorn_worker(kind: Any) -> Any:
    """A gunicorn worker of class ``kind`` as its master makes one before it
    forks, default settings, its heartbeat file closed: for a test of what a
    hook does to it."""
    from gunicorn.config import Config
    from gunicorn.glogging import Logger

    cfg = Config()
    worker = kind(0, os.getpid(), [], None, 30, cfg, Logger(cfg))
    worker.tmp.close()
    return worker


def stop_all(stops: Iterable[Callable[[], Any]]) -> None:
    """Call every one of ``stops`` (each stops something a test started),
    each whatever the ones before raised; then raise the first error. A
    teardown that stopped at its first failure left the rest running."""
    first: Optional[BaseException] = None
    for stop in stops:
        try:
            stop()
        except BaseException as exc:
            if first is None:
                first = exc
    if first is not None:
        raise first


def stop_each(processes: Iterable[subprocess.Popen[Any]]) -> None:
    """Kill each of ``processes`` and reap it (its whole group, where it
    leads one), each whatever the others raised (:func:`stop_all`)."""
    stop_all(functools.partial(_kill, process) for process in list(processes))


def _kill(process: subprocess.Popen[Any]) -> None:
    try:
        os.killpg(process.pid, signal.SIGKILL)  # the group it leads (started in a session of its own), all of it
    except ProcessLookupError:  # it leads none: itself alone
        if process.poll() is None:
            process.kill()
    process.wait(10)
