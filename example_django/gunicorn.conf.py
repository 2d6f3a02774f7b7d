"""gunicorn's settings for the example, from the repository root::

    gunicorn -c example_django/gunicorn.conf.py example_django.wsgi

One process per CPU-bound model copy: the thread backend loads the model in
each server process, so one process serves one copy, and its threads wait on
their requests' batches (``threads`` is how many requests can wait at once,
hence how large a batch can get). Each process loads its models as it boots
(``post_worker_init``: after the fork, before it takes a request), so no
request pays for it. A model that takes long to load needs a ``timeout``
above its load time: gunicorn restarts a worker silent for that long.
"""

import os

bind = os.environ.get("BIND", "127.0.0.1:8000")
workers = int(os.environ.get("WEB_CONCURRENCY", "1"))
worker_class = "gthread"
threads = 64
timeout = 120


def post_worker_init(worker):
    from django_streamer import start_streamers

    start_streamers()


def child_exit(server, worker):
    # Under prometheus_client's multiprocess mode (PROMETHEUS_MULTIPROC_DIR
    # set, several workers): a dead worker's gauges go with it.
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        from prometheus_client import multiprocess

        multiprocess.mark_process_dead(worker.pid)
