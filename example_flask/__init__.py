"""example_flask: a sentence-embedding service on Flask.

    POST /naive    the model called once per request
    POST /stream   requests batched by flask_streamer

Each takes a sentence as JSON ``{"s": "..."}`` or as the form field ``s``
and answers its embedding (384 floats) as JSON::

    curl -X POST localhost:5005/stream -d 's=Happy birthday to you.'

Settings come from ``FLASK_*`` environment variables (Flask's
``from_prefixed_env``): ``FLASK_STREAMER_BACKEND=process`` or ``redis``,
``FLASK_STREAMER_REDIS_URL``, ``FLASK_STREAMER_WORKER_NUM``,
``FLASK_EMBEDDING_MODEL`` (a model name or a local path),
``FLASK_EMBEDDING_PRECISION`` (``auto``, ``float32`` or ``bfloat16``: see
``example_models.embedding.PRECISIONS``).

Its models, and the OpenAI embeddings API it serves one by, are in
``example_models``, which the Django example imports too. It runs from
the repository's root (it is not in the wheel).
"""

from .app import create_app

__all__ = ["create_app"]
