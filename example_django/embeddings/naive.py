"""The model in this web process, for /naive: loaded on first use, once."""

from __future__ import annotations

import threading
from typing import Any, Optional

from django.conf import settings

from example_flask.embedding import load_sentence_model

_lock = threading.Lock()
_model: Optional[Any] = None


def naive_model() -> Any:
    """The SentenceTransformer of ``settings.EMBEDDING_MODEL``, loaded on first use."""
    global _model
    if _model is None:
        with _lock:
            if _model is None:
                _model = load_sentence_model(settings.EMBEDDING_MODEL, precision=settings.EMBEDDING_PRECISION)
    return _model
