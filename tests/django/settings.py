"""The settings of the Django tests' small project.

``STREAMER`` comes from the environment so that ``run_gpu_workers``, run as a
subprocess, serves the same models at the same Redis keys as the test:
``TEST_STREAMER_BACKEND`` (default thread), ``TEST_STREAMER_REDIS_URL``,
``TEST_STREAMER_PREFIX``, ``TEST_STREAMER_FOLDER`` (HoldModel's and
MarkedModel's folder), ``TEST_STREAMER_MAX_BODY_BYTES``. Tests change it with pytest-django's ``settings``.
"""

import os
import tempfile

SECRET_KEY = "django-streamer-tests-only"
DEBUG = False
ALLOWED_HOSTS = ["127.0.0.1", "localhost", "testserver"]
INSTALLED_APPS = [
    "django.contrib.contenttypes",  # auth's users and permissions: tests/django/test_idioms.py
    "django.contrib.auth",
    "django.contrib.sessions",
    "django_streamer",
]
MIDDLEWARE = [
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
]
ROOT_URLCONF = "tests.django.urls"
DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": os.environ.get("TEST_DJANGO_DB", os.path.join(tempfile.gettempdir(), "django_streamer_tests.sqlite3")),
    }
}
USE_TZ = True
DEFAULT_AUTO_FIELD = "django.db.models.AutoField"

_FOLDER = os.environ.get("TEST_STREAMER_FOLDER", tempfile.gettempdir())

STREAMER = {
    "BACKEND": os.environ.get("TEST_STREAMER_BACKEND", "thread"),
    "REDIS_URL": os.environ.get("TEST_STREAMER_REDIS_URL"),
    "PREFIX": os.environ.get("TEST_STREAMER_PREFIX", "django-tests"),
    "BATCH_SIZE": 8,
    "MAX_LATENCY": 0.05,
    "TIMEOUT": 10,
    "MAX_BODY_BYTES": int(os.environ.get("TEST_STREAMER_MAX_BODY_BYTES", 10 * 1024 * 1024)),
    "MODELS": {
        "double": {"MODEL": "tests.django.batch_models.double"},
        "sizes": {"MODEL": "tests.django.batch_models.sizes", "MAX_LATENCY": 0.1},
        "pid": {"MODEL": "tests.django.batch_models:with_pid", "WORKER_NUM": 2},
        "hold": {"MODEL": "tests.django.batch_models.HoldModel", "INIT_KWARGS": {"folder": _FOLDER}},
        "marked": {"MODEL": "tests.django.batch_models.MarkedModel", "INIT_KWARGS": {"folder": _FOLDER}},
        "vectors": {"MODEL": "tests.django.batch_models.vectors"},
        "uploads": {"MODEL": "tests.django.batch_models.describe_upload"},
        "gate": {"MODEL": "tests.core.models.RecordingGate", "INIT_KWARGS": {"folder": _FOLDER}},
        "ranked": {
            "MODEL": "tests.core.models.RecordingGate",
            "INIT_KWARGS": {"folder": _FOLDER},
            "BATCH_SIZE": 2,
            "PRIORITY_LEVELS": 2,
        },
    },
}

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"stderr": {"class": "logging.StreamHandler"}},
    "loggers": {"django_streamer": {"handlers": ["stderr"], "level": "WARNING", "propagate": False}},
}
