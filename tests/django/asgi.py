"""The test project under an ASGI server (uvicorn), loading its models as
the server boots, as the example's ``asgi.py`` does."""

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.django.settings")
application = get_asgi_application()

from django_streamer import start_streamers  # noqa: E402  (after Django is set up)

start_streamers()
