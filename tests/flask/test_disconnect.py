"""A client that disconnects while its request waits for a busy model,
under gunicorn's gevent and gthread workers: the view notices the closed
socket (``environ["gunicorn.socket"]``), gives the call up, and its input
never reaches the model; it is counted as dropped for ``disconnected``."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.core.models import ran_inputs
from tests.flask.live import free_port, get, gunicorn_argv, in_background, live_server, post
from tests.helpers import post_and_leave, wait_for


@pytest.mark.parametrize("worker", [["-k", "gevent"], ["-k", "gthread", "--threads", "8"]], ids=["gevent", "gthread"])
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
