"""gunicorn's server hooks for a Flask app with batched routes, in one line
of a ``gunicorn.conf.py``::

    from flask_streamer.gunicorn import child_exit, on_exit, on_starting, post_worker_init, pre_fork  # noqa: F401

See :mod:`streamer_core.web.gunicorn` for what each does.
"""

from __future__ import annotations

from typing import Any

from streamer_core.web.gunicorn import child_exit, on_exit, on_starting, pre_fork, settle

from .extension import start_streamers
from .state import state_of

__all__ = ["on_starting", "on_exit", "pre_fork", "post_worker_init", "child_exit"]


def post_worker_init(worker: Any) -> None:
    """Load the app's models in this process before it takes a request
    (:func:`~flask_streamer.start_streamers`), then settle it
    (:func:`streamer_core.web.gunicorn.settle`)."""
    app = worker.wsgi
    start_streamers(app)
    state = state_of(app)
    settle(worker, (handle.spec.backend for handle in state.handles.values()), state.shortcuts)
