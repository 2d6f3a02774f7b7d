"""service_streamer's side of ``bench/cost_bench.py``: the examples' model as
a subclass of service_streamer's ``ManagedModel`` (each library checks that
its workers' model derives from its own class)."""

from __future__ import annotations

import os
from typing import Any, List

import service_streamer

from example_models.embedding import embed, load_sentence_model


class LegacySentenceEmbedder(service_streamer.ManagedModel):  # type: ignore[misc]
    """all-MiniLM-L6-v2 for service_streamer 0.1.2's ``Streamer`` and Redis
    workers (which call ``init_model()`` without arguments)."""

    def init_model(self, *args: Any, **kwargs: Any) -> None:
        # As the examples: EMBEDDING_PRECISION (scale_bench --precision), else auto.
        self.model = load_sentence_model(precision=os.environ.get("EMBEDDING_PRECISION", "auto"))

    def predict(self, batch: List[str]) -> List[List[float]]:
        return embed(self.model, batch)


class LegacyListEmbedder(LegacySentenceEmbedder):
    """The same, answering lists of floats: what a service_streamer view
    that hands its output to ``jsonify`` needs (``bench/scale_bench.py``'s
    ``ss-process`` and ``ss-redis``)."""

    def predict(self, batch: List[str]) -> List[List[float]]:
        result: List[List[float]] = embed(self.model, batch).tolist()
        return result
