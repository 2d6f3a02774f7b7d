"""The engine without a web framework (docs/index.md), run by tests/test_docs.py."""

# ruff: noqa: E402, I001  (imports as the docs show them)

import asyncio


class _Lengths:
    def encode(self, batch):
        return [len(text) for text in batch]


model = _Lengths()

# --8<-- [start:use]
from streamer_core import ThreadedStreamer


def predict(batch: list) -> list:  # your model: a list in, a list out, same length and order
    return model.encode(batch)


streamer = ThreadedStreamer(predict, batch_size=64, max_latency=0.1)

outputs = streamer.predict(["one sentence", "another"])  # blocks; shares model calls with other callers
future = streamer.submit(["a third"])  # a concurrent.futures.Future of the list
outputs = future.result(timeout=5)


async def handler():
    return await streamer.apredict(["from async code"])  # does not block the event loop


outputs = asyncio.run(handler())
streamer.close()  # or use it as a context manager
# --8<-- [end:use]
