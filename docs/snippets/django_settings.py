"""A Django project's settings for django_streamer (README.md, docs/django.md):
tests/test_docs.py runs a project with them, on the thread backend."""

# ruff: noqa: E402, I001  (imports as the docs show them)

# --8<-- [start:settings]
INSTALLED_APPS = [..., "django_streamer"]
STREAMER = {
    "BACKEND": "redis",  # "thread" | "process" | "redis"
    "REDIS_URL": "redis://127.0.0.1:6379/0",
    "MODELS": {
        "embed": {
            "MODEL": "myapp.ml.EmbeddingModel",
            "BATCH_SIZE": 64,
            "MAX_LATENCY": 0.05,
            "WORKER_NUM": 2,
            "CUDA_DEVICES": [0, 1],
            "INIT_KWARGS": {},
        },
    },
}
# --8<-- [end:settings]
