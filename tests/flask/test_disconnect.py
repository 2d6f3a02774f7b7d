"""A client that disconnects while its request waits for a busy model,
under gunicorn's gevent and gthread workers: the view notices the closed
socket (``environ["gunicorn.socket"]``), gives the call up, and its input
never reaches the model; it is counted as dropped for ``disconnected``.
One that disconnects before its whole body arrived is counted as
``cancelled`` too, not as an invalid input; a malformed body sent in
chunks is the client's 400, not a server error."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Dict, List

import pytest

from tests.core.models import ran_inputs
from tests.flask.live import free_port, get, granian_argv, gunicorn_argv, in_background, live_server, post, uwsgi_argv
from tests.helpers import CUT_BODIES, post_and_leave, post_raw, wait_for


@pytest.mark.parametrize(
    "worker",
    [["-k", "gevent"], ["-k", "gevent_pywsgi"], ["-k", "gthread", "--threads", "8"]],
    ids=["gevent", "gevent_pywsgi", "gthread"],
)
def test_a_client_that_leaves_never_reaches_the_model(tmp_path: Path, worker: list) -> None:
    port = free_port()
    (tmp_path / "hold").write_text("")
    settings = {"GATE_FOLDER": str(tmp_path), "STREAMER_TIMEOUT": 20}
    with live_server(gunicorn_argv(port, "-w", "1", *worker), port, settings):
        held, box = in_background(post, port, "/gate", "hold", 30.0)
        assert wait_for(lambda: (tmp_path / "inside").exists(), 10), "the held request never reached the model"
        post_and_leave(port, "/gate", "left", stay_s=0.3)
        assert wait_for(lambda: get(port, "/dropped")[1]["disconnected"] == 0, 1)  # not yet: it waits in the queue
        time.sleep(0.5)  # the view looks at the socket every 0.1 s
        (tmp_path / "hold").unlink()
        held.join(15)
        assert box["result"][:2] == (200, "ok:hold"), box
        assert post(port, "/gate", "after")[:2] == (200, "ok:after")
        assert ran_inputs(tmp_path) == ["hold", "after"], "the model ran the request of a client that had left"
        assert get(port, "/dropped")[1] == {"cancelled": 0, "expired": 0, "disconnected": 1}


def _servers(port: int) -> Dict[str, List[str]]:
    return {
        "gunicorn-gevent": gunicorn_argv(port, "-w", "1", "-k", "gevent"),
        "gunicorn-gevent_pywsgi": gunicorn_argv(port, "-w", "1", "-k", "gevent_pywsgi"),
        "gunicorn-gthread": gunicorn_argv(port, "-w", "1", "-k", "gthread", "--threads", "8"),
        "uwsgi": uwsgi_argv(port, "--master", "--processes", "1", "--threads", "4"),
        "granian": granian_argv(port, "--blocking-threads", "4"),
    }


@pytest.mark.parametrize(
    "server", ["gunicorn-gevent", "gunicorn-gevent_pywsgi", "gunicorn-gthread", "uwsgi", "granian"]
)
def test_a_client_that_leaves_mid_body_is_cancelled_not_an_invalid_input(tmp_path: Path, server: str) -> None:
    """gunicorn: the client's socket is seen closed; uWSGI: werkzeug says
    the input ended early; granian hands the view what came (its length
    tells). uWSGI answers a body in chunks 411, granian hands one cut
    short as whole: only gunicorn's workers tell one cut short."""
    port = free_port()
    gunicorn = server.startswith("gunicorn")
    cuts = list(CUT_BODIES.values()) if gunicorn else [CUT_BODIES["content-length"]]
    with live_server(_servers(port)[server], port, {"GATE_FOLDER": str(tmp_path)}) as live:
        for n, (head, body) in enumerate(cuts, 1):
            post_raw(port, "/gate", head, body, leave=True)
            assert wait_for(lambda n=n: get(port, "/outcomes")[1]["cancelled"] == n, 5), get(port, "/outcomes")
        if gunicorn:
            # A malformed chunk size, the client waiting for its answer: a 400 that says why.
            answer = post_raw(port, "/gate", "Transfer-Encoding: chunked\r\n", b'zz\r\n{"s": "x"}\r\n0\r\n\r\n')
            assert answer.startswith(b"HTTP/1.1 400"), answer[:300]
            assert b"the body sent in chunks could not be read" in answer, answer
        outcomes = get(port, "/outcomes")[1]
        expected = (len(cuts), 1 if gunicorn else 0, 0)
        assert (outcomes["cancelled"], outcomes["invalid"], outcomes["model_error"]) == expected, outcomes
        assert ran_inputs(tmp_path) == []
        assert "Traceback" not in live.log.read_text()


def test_peer_closed_tells_a_closed_peer_from_an_open_or_talking_one() -> None:
    """The peek never blocks and never consumes: an open socket with
    nothing sent, and one with bytes waiting (a pipelined request, read
    later by the server as they were), are open; a closed peer is not."""
    import socket

    from streamer_core.web.peer import peer_closed

    ours, theirs = socket.socketpair()
    with ours:
        assert peer_closed(ours) is False
        theirs.sendall(b"GET / HTTP/1.1\r\n")
        assert peer_closed(ours) is False
        assert ours.recv(100) == b"GET / HTTP/1.1\r\n", "the peek consumed what the client sent"
        theirs.close()
        assert peer_closed(ours) is True


def test_a_call_given_up_for_a_client_that_left_answers_499() -> None:
    """Nobody reads it; but it is no server error, neither logged nor counted as one."""
    import concurrent.futures

    from streamer_core.web.http import status_for

    assert status_for(concurrent.futures.CancelledError()) == 499


def test_a_client_gone_before_its_body_arrived_answers_499_counted_cancelled() -> None:
    """As a call given up for a client that left: no invalid input, no server error."""
    from streamer_core.errors import ClientDisconnected
    from streamer_core.telemetry.stats import outcome_of
    from streamer_core.web.http import error_response, status_for

    gone = ClientDisconnected("the connection closed after 10 of the body's 100 bytes (its Content-Length)")
    assert status_for(gone) == 499 and outcome_of(gone) == "cancelled"
    assert error_response(gone)[1]["error"]["type"] == "ClientDisconnected"
