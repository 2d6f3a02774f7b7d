"""The example under a WSGI server::

    gunicorn -c example_django/gunicorn.conf.py example_django.wsgi
    uwsgi --http 127.0.0.1:8000 --module example_django.wsgi:application --master \
        --processes 1 --threads 64 --lazy-apps --need-app --die-on-term

Under gunicorn the config's ``post_worker_init`` hook loads the models once
a worker is up. uWSGI has no such hook, so under uWSGI this module loads
them as it is imported (with ``--lazy-apps``, in each worker after the
fork), keeps what loading made out of the garbage collector's sight, and
makes sure a signal wakes the main thread, as the Flask example's WSGI
module does: no request waits for a model to load. Anywhere else (a
gunicorn without the config, a test client) the models load on first use.
"""

import os

from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "example_django.settings")
application = get_wsgi_application()

try:
    import uwsgi  # noqa: F401  (a module only uWSGI's own Python has)
except ImportError:
    pass
else:
    from django_streamer import start_streamers
    from streamer_core.web.settling import freeze_after_loading, wake_main_thread_on_signals

    start_streamers()
    freeze_after_loading()
    wake_main_thread_on_signals()
