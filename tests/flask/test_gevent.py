"""gevent's WSGIServer with and without ``monkey.patch_all()``.

Without patching every request is a greenlet on one OS thread, and a view
that waited for its batch on a plain lock would stop the whole server: no
other request is accepted until the model answers, so no batch ever holds
two requests (service_streamer's batched endpoint collapses to about 8
requests/s there). These tests fire concurrent requests at a live server,
check that they are batched together, and time GET /ping while a slow
batch is in the model: it must answer at once. The control test runs the
same server with the library's greenlet-aware wait turned off and shows
that these checks catch a blocked loop.
"""

from __future__ import annotations

import statistics
import time

from tests.flask.live import (
    PING_LIMIT,
    PING_MEDIAN_LIMIT,
    check_loop_free,
    fire,
    free_port,
    get,
    gevent_argv,
    in_background,
    live_server,
    ping_while,
    post,
)

CLIENTS = 48
PER_CLIENT = 3
MIN_MEAN_BATCH = 3.0


def check_batched(port: int, tag: str):
    fire(port, "/predict", 4, 1, tag=f"{tag}-warm-up")
    volley = fire(port, "/predict", CLIENTS, PER_CLIENT, tag=tag)
    volley.check_answers()
    assert volley.max_batch() > 1, f"no two concurrent requests were batched together: {volley.summary()}"
    assert volley.mean_batch() >= MIN_MEAN_BATCH, f"batches barely formed: {volley.summary()}"
    return volley


def check_mode(port: int, patched: bool) -> None:
    status, info, _ = get(port, "/ping")
    assert status == 200, info
    assert info["gevent"] is True and info["greenlet"] is True, f"the view does not run in a gevent greenlet: {info}"
    assert info["patched"] is patched, f"expected threading {'patched' if patched else 'not patched'}: {info}"


def test_unpatched_wsgiserver_batches_and_does_not_block_the_loop():
    port = free_port()
    with live_server(gevent_argv(port, patched=False), port):
        check_mode(port, patched=False)
        check_batched(port, "unpatched")
        check_loop_free(port)


def test_patched_wsgiserver_batches_and_does_not_block_the_loop():
    """Patched, the streamer's threads would be greenlets; the model (which
    holds its OS thread as an accelerator call does, not yielding to gevent)
    must run on a real thread, or it would stop the loop instead."""
    port = free_port()
    with live_server(gevent_argv(port, patched=True), port):
        check_mode(port, patched=True)
        check_batched(port, "patched")
        check_loop_free(port)


def test_unpatched_timeout_answers_504_on_time_and_the_server_stays_responsive():
    port = free_port()
    settings = {"STREAMER_TIMEOUT": 0.3, "SLOW_SLEEP": 1.5}
    with live_server(gevent_argv(port, patched=False), port, settings):
        check_mode(port, patched=False)
        busy, box = in_background(fire, port, "/slow", 6, 1, 10.0, "timeout")
        pings = ping_while(port, busy)
        busy.join(30)
        assert "error" not in box, box.get("error")
        volley = box["result"]
        assert volley.statuses() == {504: 6}, volley.summary()
        for reply in volley.replies:
            assert reply.body["error"]["type"] == "StreamerTimeoutError", reply.body
            assert reply.body["error"]["status"] == 504, reply.body
            assert 0.25 <= reply.seconds < 1.0, f"the 504 came after {reply.seconds:.3f}s for a 0.3s timeout"
        worst = max(p.seconds for p in pings)
        assert pings and worst < PING_LIMIT, f"a ping took {worst:.3f}s while requests waited to time out"
        # The model is still busy with the given-up batch; the server is not.
        status, body, seconds = get(port, "/ping")
        assert status == 200 and body["in_model"]["slow"] == 1 and seconds < PING_LIMIT, (status, body, seconds)
        status, body, _ = post(port, "/predict", "after")
        assert status == 200 and body["x"] == "after", body


def test_control_a_blocking_wait_is_caught():
    """The library's greenlet-aware wait turned off (BLOCKING_WAIT): the
    view waits on a plain lock as service_streamer's does. Under unpatched
    gevent that serves one request per batch and leaves pings waiting for
    the model, which is what the checks above must catch."""
    port = free_port()
    with live_server(gevent_argv(port, patched=False), port, {"BLOCKING_WAIT": True}):
        volley = fire(port, "/predict", 16, 2, tag="blocking")
        volley.check_answers()
        assert volley.max_batch() == 1, volley.summary()
        busy, box = in_background(fire, port, "/slow", 3, 1, 10.0, "blocking-slow")
        time.sleep(0.1)
        pings = ping_while(port, busy)
        busy.join(30)
        assert box["result"].statuses() == {200: 3}, box["result"].summary()
        seconds = [p.seconds for p in pings]
        assert max(seconds) > PING_LIMIT, [round(s, 3) for s in seconds]
        assert statistics.median(seconds) > PING_MEDIAN_LIMIT, [round(s, 3) for s in seconds]
