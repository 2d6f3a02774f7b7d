"""Batched routes under real servers, each started as a subprocess: the
threaded Flask development server, gunicorn's gthread and gevent workers
(one and two worker processes), uWSGI (threads, processes forked from
its master or with ``--lazy-apps``, the process backend), and granian (its
Rust HTTP server, WSGI on blocking threads; one and two workers). Concurrent requests must be batched
together, every request must get its own answer, and while a batch is in
the model the server must go on answering other requests.

gevent's own WSGIServer, with and without monkey-patching, is in
test_gevent.py.
"""

from __future__ import annotations

import signal
import subprocess
from collections import defaultdict
from typing import Any, Dict

import pytest

from tests.flask.live import (
    check_loop_free,
    fire,
    flask_dev_argv,
    free_port,
    get,
    granian_argv,
    gunicorn_argv,
    live_server,
    post,
    uwsgi_argv,
)

CLIENTS = 48
PER_CLIENT = 3
MIN_MEAN_BATCH = 3.0  # batches seen with 48 clients on 2 cores: a mean of 8 to 30


def check_batched(port: int, tag: str) -> Any:
    fire(port, "/predict", 4, 1, tag=f"{tag}-warm-up")  # starts the streamer (in one process at least)
    volley = fire(port, "/predict", CLIENTS, PER_CLIENT, tag=tag)
    volley.check_answers()
    assert volley.max_batch() > 1, f"no two concurrent requests were batched together: {volley.summary()}"
    assert volley.mean_batch() >= MIN_MEAN_BATCH, f"batches barely formed: {volley.summary()}"
    return volley


def mode(port: int) -> Dict[str, Any]:
    status, body, _ = get(port, "/ping")
    assert status == 200, body
    return body


def check_each_process_batches(port: int, server: Any, rounds: int, tag: str) -> None:
    """Volleys until both of the server's two worker processes have served a
    fair share (the kernel picks who accepts): each answered from a process
    of this server, not its master, and each batched requests of its own."""
    served: Dict[int, list] = defaultdict(list)
    for round_ in range(rounds):
        volley = fire(port, "/predict", CLIENTS, PER_CLIENT, tag=f"{tag}-{round_}")
        volley.check_answers()
        for reply in volley.replies:
            served[reply.body["pid"]].append(reply.body["batch"])
        if len(served) == 2 and min(map(len, served.values())) >= 20:
            break
    assert all(map(server.ours, served)), f"answers came from processes not of this server: {sorted(served)}"
    assert server.process.pid not in served, "the server's master itself ran the model"
    assert len(served) == 2, f"only the worker(s) {sorted(served)} answered"
    for pid, sizes in served.items():
        assert max(sizes) > 1, f"worker {pid} never batched two requests: {sizes}"
        # A process's batch holds only that process's requests.
        assert max(sizes) <= len(sizes), f"worker {pid} reports a batch bigger than all it served: {sizes}"


def test_flask_development_server_threaded():
    port = free_port()
    with live_server(flask_dev_argv(port), port) as server:
        assert mode(port)["gevent"] is False
        volley = check_batched(port, "dev")
        assert volley.pids() == {server.process.pid}
        check_loop_free(port)


def test_gunicorn_gthread_worker():
    port = free_port()
    with live_server(gunicorn_argv(port, "-w", "1", "-k", "gthread", "--threads", "32"), port) as server:
        assert mode(port)["gevent"] is False
        volley = check_batched(port, "gthread")
        assert len(volley.pids()) == 1 and all(map(server.ours, volley.pids()))
        check_loop_free(port)


def test_gunicorn_sync_worker_with_threads_runs_as_gthread():
    """``-k sync --threads N``: gunicorn switches to its threaded worker, and batches form."""
    port = free_port()
    with live_server(gunicorn_argv(port, "-w", "1", "-k", "sync", "--threads", "32"), port):
        check_batched(port, "sync-threads")


@pytest.mark.parametrize("worker", ["gevent", "gevent_pywsgi"])
def test_gunicorn_gevent_worker(worker: str) -> None:
    port = free_port()
    argv = gunicorn_argv(port, "-w", "1", "-k", worker, "--worker-connections", "100")
    with live_server(argv, port):
        info = mode(port)
        assert info["gevent"] is True and info["patched"] is True and info["greenlet"] is True, info
        check_batched(port, "gevent-worker")
        check_loop_free(port)


@pytest.mark.parametrize(
    "worker",
    [["-k", "gevent"], ["-k", "gevent_pywsgi"], ["-k", "gthread", "--threads", "8"]],
    ids=["gevent", "gevent_pywsgi", "gthread"],
)
def test_sigterm_stops_a_gunicorn_worker_that_imported_the_library_after_the_fork(worker):
    """No config of the project's (whose hooks import the library in the
    master): the app, and the library with it, is first imported in the
    worker. Under gevent the streamer's threads are greenlets on the
    worker's one OS thread, which must keep its signals: SIGTERM then stops
    the worker at once, not after the graceful timeout's SIGKILL."""
    port = free_port()
    argv = gunicorn_argv(port, "-w", "1", *worker)
    argv[argv.index("--graceful-timeout") + 1] = "30"
    with live_server(argv, port) as server:
        assert post(port, "/predict", 1)[0] == 200  # the model's threads have run
        assert server.process is not None
        server.process.send_signal(signal.SIGTERM)
        try:
            server.process.wait(10)
        except subprocess.TimeoutExpired:
            pytest.fail(f"gunicorn still running 10 s after SIGTERM:\n{server.output()[-2000:]}")
        assert server.process.returncode == 0, server.output()[-2000:]


def test_gunicorn_two_worker_processes_each_batch_with_their_own_streamer():
    port = free_port()
    with live_server(gunicorn_argv(port, "-w", "2", "-k", "gthread", "--threads", "16"), port) as server:
        check_each_process_batches(port, server, 4, "w2")


def test_control_the_dev_server_without_threads_cannot_batch():
    """Control: ``--without-threads`` serves one request at a time, so no
    batch can hold two requests. Were it batched, the checks above would not
    tell a batching server from one that is not."""
    port = free_port()
    argv = [a for a in flask_dev_argv(port) if a != "--with-threads"] + ["--without-threads"]
    with live_server(argv, port):
        volley = fire(port, "/predict", 8, 2, tag="unthreaded")
        volley.check_answers()
        assert volley.max_batch() == 1, volley.summary()


# -- uWSGI -----------------------------------------------------------------------------


def test_uwsgi_one_process_with_threads():
    port = free_port()
    with live_server(uwsgi_argv(port, "--master", "--processes", "1", "--threads", "32"), port) as server:
        volley = check_batched(port, "uwsgi-threads")
        assert len(volley.pids()) == 1 and all(map(server.ours, volley.pids()))


@pytest.mark.parametrize("lazy", [False, True], ids=["forked-from-the-master", "lazy-apps"])
def test_uwsgi_several_processes_each_batch_with_their_own_streamer(lazy):
    """Without ``--lazy-apps`` the master loads the app and forks the
    workers (as gunicorn's ``--preload``): each gets a streamer of its own."""
    port = free_port()
    options = ["--master", "--processes", "2", "--threads", "16"] + (["--lazy-apps"] if lazy else [])
    with live_server(uwsgi_argv(port, *options), port) as server:
        check_each_process_batches(port, server, 6, f"uwsgi-{lazy}")


def test_uwsgi_runs_the_process_backends_workers():
    """uWSGI sets sys.executable to its own binary; spawned workers must
    still start (with this interpreter's python) and serve."""
    port = free_port()
    settings = {"STREAMER_BACKEND": "process"}
    with live_server(uwsgi_argv(port, "--master", "--processes", "1", "--threads", "32"), port, settings) as server:
        volley = check_batched(port, "uwsgi-process")
        assert server.process.pid not in volley.pids(), "the model ran in a spawned worker, not in uWSGI"


def test_control_uwsgi_without_threads_serves_one_request_at_a_time():
    port = free_port()
    with live_server(uwsgi_argv(port, "--master", "--processes", "1"), port):
        volley = fire(port, "/predict", 8, 2, tag="uwsgi-unthreaded")
        volley.check_answers()
        assert volley.max_batch() == 1, volley.summary()


def test_granian_one_worker_with_blocking_threads():
    port = free_port()
    with live_server(granian_argv(port, "--workers", "1", "--blocking-threads", "64"), port) as server:
        assert mode(port)["gevent"] is False
        volley = check_batched(port, "granian")
        assert len(volley.pids()) == 1 and all(map(server.ours, volley.pids()))
        check_loop_free(port)


def test_granian_two_workers_each_batch_with_their_own_streamer():
    """granian spawns its workers, each importing the WSGI module: each
    gets a streamer, and its model, of its own."""
    port = free_port()
    with live_server(granian_argv(port, "--workers", "2", "--blocking-threads", "32"), port) as server:
        check_each_process_batches(port, server, 8, "granian-2")
