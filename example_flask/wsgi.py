r"""The example as a module-level WSGI app, for servers that do not call an
app factory and have no hook to run once a process is up (granian, uWSGI)::

    granian --interface wsgi --port 5005 --workers 1 --blocking-threads 128 example_flask.wsgi:app
    uwsgi --http 127.0.0.1:5005 --module example_flask.wsgi:app --master \
        --processes 1 --threads 64 --lazy-apps --need-app --die-on-term

It loads the model as it is imported, then keeps what loading made out of
the garbage collector's sight (:func:`~streamer_core.web.settling.freeze_after_loading`,
what gunicorn's ``post_worker_init`` hook does for ``gunicorn.conf.py``):
unfrozen, a full collection stalled every waiting request for 200 ms or
more. And it makes sure a signal wakes the process's main thread
(:func:`~streamer_core.web.settling.wake_main_thread_on_signals`): a
granian worker otherwise missed its SIGTERM now and then, and never
exited. granian imports it in each worker process; with ``--lazy-apps``, each
uWSGI worker imports it after the fork, so each loads its own copy before
it serves. (Without ``--lazy-apps`` the master would import it before
forking, loading a copy that no worker can use.)
"""

from flask_streamer import start_streamers
from streamer_core.web.settling import freeze_after_loading, wake_main_thread_on_signals

from . import create_app

app = create_app()
start_streamers(app)
freeze_after_loading()
wake_main_thread_on_signals()
