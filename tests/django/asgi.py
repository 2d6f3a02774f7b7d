"""The test project under an ASGI server (uvicorn)."""

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.django.settings")
application = get_asgi_application()
