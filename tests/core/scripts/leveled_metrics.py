"""A model of two priority levels scraped with inputs waiting at level 2, as
a web process's ``/metrics`` scrapes it: run by tests/core/test_priority.py
once in one-process mode and once under ``PROMETHEUS_MULTIPROC_DIR``, which
reads the exposition it prints.

    python leveled_metrics.py MODEL_NAME

Before the scrape: one call answered at level 1, two at level 2; then one
call at level 1 held in the model and three waiting at level 2.
"""

from __future__ import annotations

import sys
import threading
import time
from typing import List

from streamer_core import ThreadedStreamer
from streamer_core.telemetry.metrics import exposition

WAITING = 3

held = threading.Event()


def model(batch: List[str]) -> List[int]:
    if "hold" in batch:
        held.wait(30)
    return [len(x) for x in batch]


def depth_shown(text: str) -> bool:
    """Whether some level's depth reads WAITING (under multiprocess mode the
    gauges are written every second, not at the scrape)."""
    lines = [line for line in text.splitlines() if line.startswith("streamer_priority_queue_depth{")]
    return any(float(line.rsplit(" ", 1)[1]) == WAITING for line in lines)


def main() -> None:
    streamer = ThreadedStreamer(model, 4, 0.0, name=sys.argv[1], priority_levels=2)
    try:
        assert streamer.predict(["a"], priority=1) == [1]
        assert streamer.predict(["bb"], priority=2) == [2] and streamer.predict(["cc"], priority=2) == [2]
        holding = streamer.submit(["hold"], priority=1)
        deadline = time.monotonic() + 10
        while streamer.queued() and time.monotonic() < deadline:
            time.sleep(0.01)
        waiting = [streamer.submit([f"w{i}"], priority=2) for i in range(WAITING)]
        assert streamer.queued() == WAITING, streamer.queued()
        text = exposition()[0].decode()
        deadline = time.monotonic() + 10
        while not depth_shown(text) and time.monotonic() < deadline:
            time.sleep(0.05)
            text = exposition()[0].decode()
        print(text)
    finally:
        held.set()
    assert holding.result(10) == [4] and [call.result(10) for call in waiting] == [[2]] * WAITING
    streamer.close()


if __name__ == "__main__":
    main()
