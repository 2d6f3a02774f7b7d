"""The example under an ASGI server: ``uvicorn example_django.asgi:application``
(POST /astream then awaits its embedding without blocking the event loop).

The models load as the server process boots, not on the first request:
``start_streamers()`` runs in each server process as it imports this module
(uvicorn's ``--workers`` spawn their processes, so each loads its own)."""

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "example_django.settings")
application = get_asgi_application()

from django_streamer import start_streamers  # noqa: E402  (after Django is set up)

start_streamers()
