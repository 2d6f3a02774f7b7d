"""Priority levels on a streamer (docs/behaviour.md), run by tests/test_docs.py."""

# ruff: noqa: E402, I001  (imports as the docs show them)

from streamer_core import ThreadedStreamer


def embed(batch):
    return [len(text) for text in batch]


documents = ["a page", "another page"]

# --8<-- [start:levels]
streamer = ThreadedStreamer(embed, batch_size=64, priority_levels=2, default_priority=2, priority_aging=5.0)
streamer.predict(["what the user typed"], priority=1)  # interactive: served first
streamer.submit(documents)  # bulk: the default, 2
# --8<-- [end:levels]
