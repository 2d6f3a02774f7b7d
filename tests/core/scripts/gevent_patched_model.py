"""Run under ``monkey.patch_all()``: a thread-backend model that computes for
0.3 s per batch while a ticker greenlet sleeps 10 ms at a time. Prints one
JSON line: the results, the batch sizes, and the longest gap between ticks."""

from gevent import monkey

monkey.patch_all()

import hashlib  # noqa: E402
import json  # noqa: E402
import time  # noqa: E402

import gevent  # noqa: E402

from streamer_core import ThreadedStreamer  # noqa: E402

sizes = []


def compute(batch):
    """Busy for 0.3 s in C code that releases the GIL, as a torch model is."""
    sizes.append(len(batch))
    started = time.perf_counter()
    while time.perf_counter() - started < 0.3:
        hashlib.sha256(b"x" * 1_000_000).digest()
    return [x * 2 for x in batch]


def main() -> None:
    streamer = ThreadedStreamer(compute, batch_size=16, max_latency=0.01)
    gaps = []

    def ticker() -> None:
        last = time.perf_counter()
        for _ in range(50):
            gevent.sleep(0.01)
            now = time.perf_counter()
            gaps.append(now - last)
            last = now

    callers = [gevent.spawn(streamer.predict, [i]) for i in range(10)]
    tick = gevent.spawn(ticker)
    gevent.joinall(callers + [tick], timeout=30)
    streamer.close()
    print(json.dumps({"results": [c.value for c in callers], "sizes": sizes, "max_gap": max(gaps)}))


if __name__ == "__main__":
    main()
