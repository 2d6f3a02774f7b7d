"""Fixtures for the Flask tests: apps whose streamers are always closed, a
gated model, and helpers to fire requests from several threads at once."""

from __future__ import annotations

import functools
import itertools
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

import pytest
from flask import Flask

from flask_streamer import FlaskStreamer
from tests.flask.apps import GatedModel
from tests.helpers import stop_all

_names = itertools.count()


def close_streamers(app: Flask, timeout: float = 5.0) -> None:
    """Close every streamer (and worker process) ``app`` started in this process."""
    state = app.extensions.get("streamer")
    if state is not None:
        state.extension.close(app, timeout=timeout)


@pytest.fixture
def make_app() -> Iterator[Callable[..., Tuple[Flask, FlaskStreamer]]]:
    """``make_app(config=None, init=True)``: a new Flask app (its own name)
    with ``config`` and a FlaskStreamer set up on it (unless ``init`` is
    false); every streamer it starts is closed at the end of the test."""
    made: List[Flask] = []

    def make(config: Optional[Dict[str, Any]] = None, init: bool = True) -> Tuple[Flask, FlaskStreamer]:
        app = Flask(f"flask_test_app_{next(_names)}")
        app.config.update(config or {})
        made.append(app)
        streamer = FlaskStreamer(app) if init else FlaskStreamer()
        return app, streamer

    yield make
    stop_all(functools.partial(close_streamers, app) for app in made)  # each, whatever one raised


@pytest.fixture
def closing_app() -> Iterator[Callable[[Flask], Flask]]:
    """Register an app made elsewhere to have its streamers closed at the end."""
    made: List[Flask] = []

    def register(app: Flask) -> Flask:
        made.append(app)
        return app

    yield register
    stop_all(functools.partial(close_streamers, app) for app in made)


@pytest.fixture
def gated() -> Iterator[GatedModel]:
    model = GatedModel()
    yield model
    model.release()


@pytest.fixture
def pool() -> Iterator[ThreadPoolExecutor]:
    """Threads to make requests from; each request uses its own test client.
    Not waited for at the end: a request still held by a gated model (a
    failed test) finishes once the model is released or its app closed."""
    executor = ThreadPoolExecutor(16)
    yield executor
    executor.shutdown(wait=False, cancel_futures=True)


def post_in_thread(pool: ThreadPoolExecutor, app: Flask, path: str, **kwargs: Any) -> Future[Any]:
    """POST from another thread with a test client of its own; the future
    holds the response."""
    return pool.submit(lambda: app.test_client().post(path, **kwargs))


def error_of(response: Any, status: int) -> Dict[str, Any]:
    """Check that ``response`` is a JSON error with ``status`` and return its ``error`` object."""
    assert response.status_code == status, (response.status_code, response.get_data(as_text=True)[:2000])
    assert response.is_json, f"the error body must be JSON, got {response.content_type}: {response.data[:200]!r}"
    error = response.get_json()["error"]
    assert error["status"] == status
    assert isinstance(error["type"], str) and error["type"]
    assert isinstance(error["message"], str) and error["message"]
    return error


def spec_of(app: Flask, name: str) -> Any:
    """The checked ModelSpec the app runs the batched route ``name`` with."""
    state = app.extensions["streamer"]
    [route] = [route for route in state.handles if name in (route.name, route.endpoint)]
    return state.handles[route].spec


def queue_behind_hold(
    pool: ThreadPoolExecutor, app: Flask, path: str, endpoint: str, gated: GatedModel, inputs: List[Any]
) -> Tuple[Future[Any], List[Future[Any]]]:
    """POST ``"hold"`` to ``path`` (served by ``gated``) and wait until the
    model holds it; then POST each of ``inputs`` from its own thread and wait
    until all of them are queued behind it, so that they form the next
    batches when the test releases the model. Returns the futures of the
    held response and of the others'."""
    from tests.helpers import wait_for

    held = post_in_thread(pool, app, path, json="hold")
    assert gated.entered.wait(10), "the model never received the held input"
    streamer = app.extensions["streamer"].extension.get_streamer(endpoint, app)
    assert streamer.queued() == 0
    n, size = len(inputs), streamer.config.batch_size
    # A busy model thread takes one full batch ahead; the rest stays queued.
    # (With n >= 2 * size, or n < size, the count is reached only once all n arrived.)
    assert n < size or n >= 2 * size, "choose inputs so that the wait below is unambiguous"
    expected = n - size if n >= size else n
    futures = [post_in_thread(pool, app, path, json=x) for x in inputs]
    assert wait_for(lambda: streamer.queued() == expected, 10), f"{streamer.queued()} inputs queued, not {expected}"
    return held, futures
