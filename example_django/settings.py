"""The example's settings, read from environment variables:

========================  ============================  =====================================
variable                  default                       meaning
========================  ============================  =====================================
STREAMER_BACKEND          thread                        thread, process or redis
STREAMER_REDIS_URL        redis://127.0.0.1:6379/0      used by the redis backend
STREAMER_PREFIX           example_django                names the Redis keys
STREAMER_WORKER_NUM       1                             worker processes (process, redis)
STREAMER_MODEL_THREADS    2 (thread), else 1            batches of each model at once (thread)
STREAMER_CUDA_DEVICES     (none)                        e.g. 0,1: worker i gets devices[i % n]
STREAMER_BATCH_SIZE       64                            most sentences per model call
STREAMER_MAX_LATENCY      0.05                          seconds a sentence waits for companions
STREAMER_MAX_BATCH_COST   1024                          padded tokens per batch (token_estimate)
EMBEDDING_MODEL           all-MiniLM-L6-v2              a model name or a local path
EMBEDDING_PRECISION       auto                          float32, bfloat16, or auto: bfloat16 on
                                                        a CPU with AMX or AVX512-BF16,
                                                        else float32
IMAGE_MODEL               efficientnet-lite0            /classify's model: a name or a .pth file
CLASSIFY_BATCH_SIZE       4                             most images per model call
DJANGO_DEBUG              0                             1: Django's debug mode
DJANGO_ALLOWED_HOSTS      127.0.0.1,localhost           comma-separated
EXAMPLE_DJANGO_DB         <tmp>/example_django.sqlite3  the SQLite file (nothing is stored)
========================  ============================  =====================================

A value that is not a number where one is expected is passed on as it is,
for ``manage.py check`` to report with its id.
"""

import os
import tempfile
from typing import Any

from example_models.embedding import DEFAULT_MODEL
from example_models.vision import DEFAULT_IMAGE_MODEL


def _number(name: str, default: Any) -> Any:
    text = os.environ.get(name)
    if text is None:
        return default
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


SECRET_KEY = os.environ.get("DJANGO_SECRET_KEY", "example-django-not-secret")
DEBUG = os.environ.get("DJANGO_DEBUG", "0") == "1"
ALLOWED_HOSTS = [
    h.strip() for h in os.environ.get("DJANGO_ALLOWED_HOSTS", "127.0.0.1,localhost").split(",") if h.strip()
]

INSTALLED_APPS = [
    "django_streamer",
    "example_django.embeddings",
]
MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
]
ROOT_URLCONF = "example_django.urls"
WSGI_APPLICATION = "example_django.wsgi.application"
ASGI_APPLICATION = "example_django.asgi.application"
# No model of this project stores anything; Django wants a database for migrate.
DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": os.environ.get("EXAMPLE_DJANGO_DB", os.path.join(tempfile.gettempdir(), "example_django.sqlite3")),
    }
}
TIME_ZONE = "UTC"
USE_TZ = True
DEFAULT_AUTO_FIELD = "django.db.models.AutoField"

EMBEDDING_MODEL = os.environ.get("EMBEDDING_MODEL", DEFAULT_MODEL)
# Checked when the embeddings app is ready (example_django.embeddings.apps).
EMBEDDING_PRECISION = os.environ.get("EMBEDDING_PRECISION", "auto")
IMAGE_MODEL = os.environ.get("IMAGE_MODEL", DEFAULT_IMAGE_MODEL)

_BACKEND = os.environ.get("STREAMER_BACKEND", "thread")
# Two batches of each model at once on the thread backend, each with half of
# torch's threads on a CPU (example_models.embedding.share_cpu); the process
# and redis backends run STREAMER_WORKER_NUM processes instead.
_MODEL_THREADS = _number("STREAMER_MODEL_THREADS", 2 if _BACKEND == "thread" else 1)

STREAMER = {
    "BACKEND": _BACKEND,
    "REDIS_URL": os.environ.get("STREAMER_REDIS_URL", "redis://127.0.0.1:6379/0"),
    "PREFIX": os.environ.get("STREAMER_PREFIX", "example_django"),
    "MODELS": {
        "embed": {
            # The same ManagedModel as example_flask's /stream: one module, not a copy.
            "MODEL": "example_models.embedding.SentenceEmbedder",
            "BATCH_SIZE": _number("STREAMER_BATCH_SIZE", 64),
            "MAX_LATENCY": _number("STREAMER_MAX_LATENCY", 0.05),
            # Batches of texts of like length, at most 1024 padded tokens
            # each: 2.5x the sentences/s of batches by count on mixed-length
            # text, and short sentences still about 48 together
            # (bench/cost_bench.py, bench/web_bench.py).
            "ITEM_COST": "example_models.embedding.token_estimate",
            "MAX_BATCH_COST": _number("STREAMER_MAX_BATCH_COST", 1024),
            "WORKER_NUM": _number("STREAMER_WORKER_NUM", 1),
            "CUDA_DEVICES": os.environ.get("STREAMER_CUDA_DEVICES") or None,
            "MODEL_THREADS": _MODEL_THREADS,
            "INIT_KWARGS": {
                "model_name": EMBEDDING_MODEL,
                "precision": EMBEDDING_PRECISION,
                "batches_at_once": _MODEL_THREADS,
            },
        },
        "classify": {
            # example_flask's /classify model, the same module: EfficientNet-Lite0.
            "MODEL": "example_models.vision.ImageClassifier",
            # Batches of 4 run fastest on a 2-core CPU; raise it on a GPU.
            "BATCH_SIZE": _number("CLASSIFY_BATCH_SIZE", 4),
            "MAX_LATENCY": 0.01,
            "WORKER_NUM": _number("STREAMER_WORKER_NUM", 1),
            "CUDA_DEVICES": os.environ.get("STREAMER_CUDA_DEVICES") or None,
            "MODEL_THREADS": _MODEL_THREADS,
            "INIT_KWARGS": {"model_name": IMAGE_MODEL, "batches_at_once": _MODEL_THREADS},
        },
    },
    # The variable each setting above was read from, so that a wrong one is
    # named as it was set (STREAMER_BACKEND), not as STREAMER['BACKEND'].
    "ENVIRONMENT": {
        "BACKEND": "STREAMER_BACKEND",
        "REDIS_URL": "STREAMER_REDIS_URL",
        "PREFIX": "STREAMER_PREFIX",
        "MODELS": {
            "embed": {
                "BATCH_SIZE": "STREAMER_BATCH_SIZE",
                "MAX_LATENCY": "STREAMER_MAX_LATENCY",
                "MAX_BATCH_COST": "STREAMER_MAX_BATCH_COST",
                "WORKER_NUM": "STREAMER_WORKER_NUM",
                "CUDA_DEVICES": "STREAMER_CUDA_DEVICES",
                "MODEL_THREADS": "STREAMER_MODEL_THREADS",
            },
            "classify": {
                "BATCH_SIZE": "CLASSIFY_BATCH_SIZE",
                "WORKER_NUM": "STREAMER_WORKER_NUM",
                "CUDA_DEVICES": "STREAMER_CUDA_DEVICES",
                "MODEL_THREADS": "STREAMER_MODEL_THREADS",
            },
        },
    },
}

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(name)s[%(process)d] %(levelname)s %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    # The line saying a model is ready (and how long it took) is INFO on
    # streamer_core; the one naming the precision it computes in, on example_models.
    "loggers": {
        "django_streamer": {"handlers": ["console"], "level": "INFO"},
        "streamer_core": {"handlers": ["console"], "level": "INFO"},
        "example_models": {"handlers": ["console"], "level": "INFO"},
    },
}
