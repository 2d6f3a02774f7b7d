"""The test project as a WSGI app whose streamers start as it is imported:
under ``gunicorn --preload`` that is in the master, before the fork (a
user's warm-up in the wrong place, which must still work)."""

import os

from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.django.settings")
application = get_wsgi_application()

from django_streamer import start_streamers  # noqa: E402  (after Django is set up)

start_streamers()
