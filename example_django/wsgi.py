"""The example under a WSGI server: ``gunicorn -w 2 --threads 32 example_django.wsgi``."""

import os

from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "example_django.settings")
application = get_wsgi_application()
