"""gunicorn's settings for the example, from the repository root::

    gunicorn -c example_django/gunicorn.conf.py example_django.wsgi

gevent workers: each process serves its connections from one event loop,
and a request waiting for its batch costs a greenlet, not a thread, so any
number of requests can wait together (a batch grows up to its size, not up
to a thread count). The streamer's own threads, the model's included, stay
real threads: the model computes beside the loop, not on it. A request cost
this process about half the CPU under gevent that it cost under 64 gthread
threads (the README's Deploy section; ``bench/scale_bench.py``). ``-k
gthread`` on the command line goes back to threads.

One process per CPU-bound model copy: the thread backend loads the model in
each server process. Each process loads its models as it boots
(``post_worker_init``: after the fork, before it takes a request), so no
request pays for it, and then runs on one core of its own unless its model
computes on this CPU with cores to spare. A model that takes long to load
needs a ``timeout`` above its load time: gunicorn restarts a worker silent
for that long.
"""

import gc
import os

from streamer_core.web.affinity import free_core_index, model_computes_here, pin_to_core, pin_wanted

bind = os.environ.get("BIND", "127.0.0.1:8000")
workers = int(os.environ.get("WEB_CONCURRENCY", "1"))
worker_class = "gevent"
worker_connections = 1000
threads = 64  # with -k gthread
timeout = 120


def pre_fork(server, worker):
    # Each web process gets a core of its own, the one of the process it
    # replaces when it restarts; pinned once it has loaded its models, where
    # that takes no core from a model computing on this CPU (PIN_WORKERS: 1
    # always, 0 never). A quarter less CPU per request than processes the
    # scheduler moves about (streamer_core/web/affinity.py).
    worker.core_index = free_core_index(getattr(other, "core_index", None) for other in server.WORKERS.values())


def post_worker_init(worker):
    from django_streamer import start_streamers

    start_streamers()
    if pin_wanted(worker.cfg.workers, model_computes_here(os.environ.get("STREAMER_BACKEND", "thread"))):
        pin_to_core(worker.core_index)  # workers the process backend spawns keep every core
    # The objects alive now (the model, torch's and the framework's modules:
    # some 450,000) are never garbage: kept out of the cyclic collector's
    # sight, a full collection takes milliseconds, not 350 ms that stall
    # every request, and with a larger first generation the collector runs
    # once per thousand requests or so instead of every 70. Together about
    # 50 microseconds of CPU a request (bench/README.md).
    gc.freeze()
    gc.set_threshold(10_000, 10, 10)


def child_exit(server, worker):
    # Under prometheus_client's multiprocess mode (PROMETHEUS_MULTIPROC_DIR
    # set, several workers): a dead worker's gauges go with it.
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        from prometheus_client import multiprocess

        multiprocess.mark_process_dead(worker.pid)
