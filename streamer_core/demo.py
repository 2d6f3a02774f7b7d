"""A one-minute look at what batching buys: ``python -m streamer_core.demo``.

It simulates an accelerator (a batch of n costs ``fixed_ms + per_item_ms * n``
of sleep, one batch at a time, as kernels queue on a GPU) and serves it to
concurrent client threads twice: once calling the model per request, once
through a :class:`ThreadedStreamer`. Then it shows a lone client's latency and
what a failing input does to its batch. Nothing to download, no GPU needed.
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time
from typing import Any, Callable, List

from . import ThreadedStreamer

_device = threading.Lock()


class SimulatedModel:
    """A batch costs ``fixed_ms + per_item_ms * len(batch)`` of the device."""

    def __init__(self, fixed_ms: float, per_item_ms: float) -> None:
        self.fixed_ms = fixed_ms
        self.per_item_ms = per_item_ms

    def __call__(self, batch: List[Any]) -> List[Any]:
        with _device:
            time.sleep((self.fixed_ms + self.per_item_ms * len(batch)) / 1000)
        for x in batch:
            if x == "bad input":
                raise ValueError("the model cannot read 'bad input'")
        return [f"embedding({x})" for x in batch]


def _closed_loop(call: Callable[[Any], Any], clients: int, seconds: float) -> List[float]:
    """Each client thread calls ``call`` back to back; returns the latencies."""
    latencies: List[float] = []
    stop = time.monotonic() + seconds

    def client(k: int) -> None:
        n = 0
        while time.monotonic() < stop:
            started = time.monotonic()
            call(f"client {k} request {n}")
            latencies.append(time.monotonic() - started)
            n += 1

    threads = [threading.Thread(target=client, args=(k,)) for k in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return latencies


def main(argv: Any = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--clients", type=int, default=32, help="concurrent client threads (default 32)")
    parser.add_argument("--seconds", type=float, default=3.0, help="seconds per run (default 3)")
    parser.add_argument("--fixed-ms", type=float, default=10.0, help="model cost per batch, ms (default 10)")
    parser.add_argument("--per-item-ms", type=float, default=0.2, help="model cost per item, ms (default 0.2)")
    args = parser.parse_args(argv)
    model = SimulatedModel(args.fixed_ms, args.per_item_ms)

    print(f"Simulated model: {args.fixed_ms:g} ms per batch + {args.per_item_ms:g} ms per item.")
    print(f"{args.clients} client threads, {args.seconds:g} s each run.\n")

    naive = _closed_loop(lambda x: model([x])[0], args.clients, args.seconds)
    print(
        f"  one model call per request : {len(naive) / args.seconds:8.0f} requests/s, "
        f"p50 {statistics.median(naive) * 1000:6.1f} ms"
    )

    with ThreadedStreamer(model, batch_size=64, max_latency=0.05) as streamer:
        batched = _closed_loop(lambda x: streamer.predict([x])[0], args.clients, args.seconds)
        print(
            f"  ThreadedStreamer, batch 64 : {len(batched) / args.seconds:8.0f} requests/s, "
            f"p50 {statistics.median(batched) * 1000:6.1f} ms  "
            f"({len(batched) / max(1, len(naive)):.1f}x)"
        )

        alone = _closed_loop(lambda x: streamer.predict([x])[0], 1, 1.0)
        print(
            f"  a lone client              : p50 {statistics.median(alone) * 1000:6.1f} ms "
            f"(the model alone takes {args.fixed_ms + args.per_item_ms:g} ms; max_latency is 50 ms)\n"
        )

        good = [streamer.submit([f"sentence {i}"]) for i in range(3)]
        bad = streamer.submit(["bad input"])
        print("A failing input only fails its own caller:")
        for future in good:
            print(f"  {future.result()[0]}")
        print(f"  bad input -> {type(bad.exception()).__name__}: {bad.exception()}")


if __name__ == "__main__":
    main()
