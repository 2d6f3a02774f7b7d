"""mosec serving the examples' sentence model, for ``bench/scale_bench.py``
(variant ``mosec``); run by the Python of a venv with mosec in it
(``bench/peer_venvs.py``), never imported by the project.

    BENCH_PEER_MODEL=/path/to/all-MiniLM-L6-v2 python bench/peers/mosec_server.py --port 8000

One Server, one Worker process, batches of up to 64 sentences formed within
10 ms (``max_batch_size``, ``max_wait_time``). Each request is the load's
JSON ``{"s": "<a sentence>"}`` POSTed to ``/inference``; the worker sees
only whole batches, encodes them with ``SentenceTransformer.encode`` and
answers each request its unit-length embedding as a JSON list, written by
orjson from the float32 row as it is, as the examples write theirs
(``streamer_core.web.http.dumps_json``). mosec's own default,
``json.dumps(indent=2)`` of a list, costs 0.22 ms an answer of 384 floats
on this machine (timeit), more than its whole per-request cost otherwise;
overriding ``serialize`` is how its docs have a user change it. mosec reads
its own command line (``--port``, ``--address``, ...); the model's path
comes in ``BENCH_PEER_MODEL``. ``BENCH_PEER_PRECISION=bfloat16`` runs the
forward pass under torch's autocast in bfloat16, as the examples'
``EMBEDDING_PRECISION=bfloat16`` does (a user of mosec would write the same
``with``); unset or ``float32``: float32.
"""

from __future__ import annotations

import os
from typing import Any, List

import orjson
from mosec import Server, Worker

BATCH = 64
WAIT_MS = 10


class Embed(Worker):
    def __init__(self) -> None:
        super().__init__()
        from sentence_transformers import SentenceTransformer

        self.model = SentenceTransformer(os.environ["BENCH_PEER_MODEL"], device="cpu")
        self.model.eval()
        self.bfloat16 = os.environ.get("BENCH_PEER_PRECISION", "float32") == "bfloat16"

    def forward(self, data: List[Any]) -> List[Any]:
        import torch

        sentences = [request["s"] for request in data]
        with torch.autocast("cpu", torch.bfloat16, enabled=self.bfloat16):
            vectors = self.model.encode(
                sentences, batch_size=len(sentences), normalize_embeddings=True, convert_to_numpy=True,
                show_progress_bar=False,
            )  # fmt: skip
        return list(vectors)

    def serialize(self, data: Any) -> bytes:
        return orjson.dumps(data, option=orjson.OPT_SERIALIZE_NUMPY)


if __name__ == "__main__":
    server = Server()
    # BENCH_PEER_WORKERS model processes (scale_bench --model-workers): 1 unless asked.
    workers = int(os.environ.get("BENCH_PEER_WORKERS", "1"))
    server.append_worker(Embed, num=workers, max_batch_size=BATCH, max_wait_time=WAIT_MS)
    server.run()
