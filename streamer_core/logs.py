"""How the worker commands and worker processes write their log lines."""

from __future__ import annotations

import logging

__all__ = ["LOG_FORMAT", "show_logs"]

#: How the worker commands and worker processes write their log lines.
LOG_FORMAT = "%(asctime)s %(name)s[%(process)d] %(levelname)s %(message)s"


def show_logs(level: int | str) -> None:
    """Write log lines at ``level`` to stderr, for the worker commands that
    load a web app first (``flask streamer run-workers``, ``manage.py
    run_gpu_workers``): through a root handler in :data:`LOG_FORMAT`, unless
    one is there already, or unless the app put a handler on
    ``streamer_core``'s own logger while it loaded (the Flask example does,
    so that its lines show under any server): a root handler beside that
    one would print each line twice. Either way ``streamer_core``'s lines
    show at ``level``, and the workers these commands start log at it too."""
    root, ours = logging.getLogger(), logging.getLogger("streamer_core")
    if not root.handlers and not ours.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter(LOG_FORMAT))
        root.addHandler(handler)
    root.setLevel(level)
    if ours.level != logging.NOTSET:
        ours.setLevel(level)
