"""The model in this web process, for /naive: loaded on first use, once per
model name and precision (the settings a test may override)."""

from __future__ import annotations

import threading
from typing import Any, Dict, Tuple

from django.conf import settings

from example_models.embedding import load_sentence_model

_lock = threading.Lock()
_models: Dict[Tuple[str, str], Any] = {}


def naive_model() -> Any:
    """The SentenceTransformer of ``settings.EMBEDDING_MODEL`` in
    ``settings.EMBEDDING_PRECISION`` (``auto`` where unset), loaded on first use."""
    key = (settings.EMBEDDING_MODEL, getattr(settings, "EMBEDDING_PRECISION", "auto"))
    model = _models.get(key)
    if model is None:
        with _lock:
            model = _models.get(key)
            if model is None:
                model = _models[key] = load_sentence_model(key[0], precision=key[1])
    return model
