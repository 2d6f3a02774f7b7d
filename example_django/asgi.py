"""The example under an ASGI server: ``uvicorn example_django.asgi:application``
(POST /astream then awaits its embedding without blocking the event loop)."""

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "example_django.settings")
application = get_asgi_application()
