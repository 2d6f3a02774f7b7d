"""LitServe serving the examples' sentence model, for
``bench/scale_bench.py`` (variant ``litserve``); run by the Python of a
venv with LitServe in it (``bench/peer_venvs.py``), never imported by the
project.

    python bench/peers/litserve_server.py --model /path/to/all-MiniLM-L6-v2 --port 8000

One LitServer, one worker on the CPU, batching on: up to 64 requests within
10 ms (``max_batch_size=64, batch_timeout=0.01``). Each request is the
load's JSON ``{"s": "<a sentence>"}`` POSTed to ``/predict``; ``predict``
gets the batch's sentences as a list, encodes them with
``SentenceTransformer.encode``, and each request is answered its
unit-length embedding as a JSON list.
"""

from __future__ import annotations

import argparse
import os
from typing import List

import litserve as ls

BATCH = 64
TIMEOUT_S = 0.01


class Embed(ls.LitAPI):
    def __init__(self, model_path: str) -> None:
        super().__init__(max_batch_size=BATCH, batch_timeout=TIMEOUT_S)
        self.model_path = model_path

    def setup(self, device: str) -> None:
        from sentence_transformers import SentenceTransformer

        self.model = SentenceTransformer(self.model_path, device=device)
        self.model.eval()
        # As mosec_server.py: bfloat16 under autocast when the benchmark asks.
        self.bfloat16 = os.environ.get("BENCH_PEER_PRECISION", "float32") == "bfloat16"

    # Neither of these two is annotated: LitServe reads the annotations to
    # type its route (none: the JSON body as a dict, the answer as JSON).
    def decode_request(self, request):  # type: ignore[no-untyped-def]
        return request["s"]

    def predict(self, sentences: List[str]) -> List[List[float]]:
        import torch

        with torch.autocast("cpu", torch.bfloat16, enabled=self.bfloat16):
            vectors = self.model.encode(
                list(sentences), batch_size=len(sentences), normalize_embeddings=True, convert_to_numpy=True,
                show_progress_bar=False,
            )  # fmt: skip
        return vectors.tolist()

    def encode_response(self, output):  # type: ignore[no-untyped-def]
        return {"embedding": output}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="the model's directory")
    parser.add_argument("--port", type=int, default=8000)
    args = parser.parse_args()
    server = ls.LitServer(Embed(args.model), accelerator="cpu", workers_per_device=1)
    # One API server process, as the others have one web process; its access
    # log off, as theirs are.
    server.run(host="127.0.0.1", port=args.port, num_api_servers=1, log_level="warning", generate_client_file=False)


if __name__ == "__main__":
    main()
