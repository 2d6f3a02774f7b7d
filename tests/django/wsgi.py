"""The test project under a WSGI server (uWSGI: ``--module tests.django.wsgi:application``)."""

import os

from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.django.settings")
application = get_wsgi_application()
