"""gunicorn's settings for the example, from the repository root::

    gunicorn -c example_django/gunicorn.conf.py example_django.wsgi

gevent workers: each process serves its connections from one event loop,
and a request waiting for its batch costs a greenlet, not a thread, so any
number of requests can wait together (a batch grows up to its size, not up
to a thread count). The streamer's own threads, the model's included, stay
real threads: the model computes beside the loop, not on it. A request cost
this process about half the CPU under gevent that it cost under 64 gthread
threads (the README's Deploy section; ``bench/scale_bench.py``). The
worker is ``gevent_pywsgi``: gevent's own HTTP server, which parses and
answers a request in less CPU than gunicorn's parser under ``-k gevent``
(1.17x the requests a second of one process on one core, with the
forward pass stubbed). ``-k gevent`` or ``-k gthread`` on the command line
goes back to those.

One process per CPU-bound model copy: the thread backend loads the model in
each server process. Each process loads its models as it boots
(``post_worker_init``: after the fork, before it takes a request), so no
request pays for it, and then runs on one core of its own unless its model
computes on this CPU with cores to spare. A model that takes long to load
needs a ``timeout`` above its load time: gunicorn restarts a worker silent
for that long.
"""

import os

# Each process: a core of its own, its models loaded before it takes a
# request, then pinned where that takes no core from a model computing on
# this CPU (PIN_WORKERS: 1 always, 0 never), what loading made kept out of
# the collector's sight (streamer_core/web/gunicorn.py says what and why).
# With more than one worker (WEB_CONCURRENCY, or -w on the command line),
# /metrics adds up every worker's numbers: on_starting sets
# PROMETHEUS_MULTIPROC_DIR to a fresh temporary directory before the first
# fork (unless it is set already), child_exit drops a dead worker's gauges,
# on_exit removes the directory.
from django_streamer.gunicorn import child_exit, on_exit, on_starting, post_worker_init, pre_fork  # noqa: F401

bind = os.environ.get("BIND", "127.0.0.1:8000")
workers = int(os.environ.get("WEB_CONCURRENCY", "1"))
worker_class = "gevent_pywsgi"
worker_connections = 1000
threads = 64  # with -k gthread
timeout = 120
