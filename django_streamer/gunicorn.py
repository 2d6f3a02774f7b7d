"""gunicorn's server hooks for a Django project with batched views, in one
line of a ``gunicorn.conf.py``::

    from django_streamer.gunicorn import child_exit, on_exit, on_starting, post_worker_init, pre_fork  # noqa: F401

See :mod:`streamer_core.web.gunicorn` for what each does. Importing it
imports nothing of Django: the config is read by gunicorn's master, before
any project names its settings module.
"""

from __future__ import annotations

from typing import Any

from streamer_core.web.gunicorn import child_exit, on_exit, on_starting, pre_fork, settle

__all__ = ["on_starting", "on_exit", "pre_fork", "post_worker_init", "child_exit"]


def post_worker_init(worker: Any) -> None:
    """Load the project's models in this process before it takes a request
    (:func:`~django_streamer.start_streamers`), then settle it
    (:func:`streamer_core.web.gunicorn.settle`). Django is imported here,
    in the worker, once the project's wsgi.py has named its settings."""
    from .conf import shortcuts
    from .registry import all_handles, start_streamers

    start_streamers()
    settle(worker, (handle.spec.backend for handle in all_handles().values()), shortcuts())
