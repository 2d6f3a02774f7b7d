"""A gunicorn.conf.py of your own with the examples' hooks (docs/deploying.md),
imported by tests/test_docs.py."""

# ruff: noqa: E402, I001  (imports as the docs show them)

# --8<-- [start:hooks]
from flask_streamer.gunicorn import child_exit, on_exit, on_starting, post_worker_init, pre_fork  # noqa: F401
# --8<-- [end:hooks]
