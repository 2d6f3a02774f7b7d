"""Clients that give up and retry, under overload: how much of the model's
time goes to answers nobody reads, and how many answers are read.

    .venv/bin/python -m bench.goodput_bench                 # about 1.5 minutes

Every client sends one input, waits up to ``--patience`` seconds (1) for
its answer, and, answered or not, sends the next at once: a caller who
gave up retries. ``--clients`` of them (600) keep the model, a simulated
device of :mod:`bench.sim` on the thread backend (batch 32, 40 ms + 2 ms an
input: about 300 inputs a second), twice as busy as it can serve within
the patience. Three variants:

- ``ours`` (after): ``predict([x], timeout=patience)``: the call's
  deadline is the client's, and an input whose caller has given up is
  dropped before it is batched (README, "Callers who leave");
- ``ours, unaware`` (before): the same streamer, but the client stops
  waiting without telling it (the call keeps the streamer's 20 s timeout):
  what happens where the server does not see its clients leave;
- ``service_streamer`` 0.1.2: ``submit([x]).result(timeout=patience)``: a
  timed-out request stays queued and runs. Needs the ``bench`` extra
  (``pip install -e '.[bench]'``), else it is left out.

Measured over ``--seconds`` after ``--warm-up``: the answers read per
second (goodput), and the share of the model's time (each batch's time,
split evenly over its inputs) spent on inputs whose answer nobody read.
Floors, PASS or MISS (never asserted): ours <= 5% of model time wasted,
and ours' goodput >= 1.5x the unaware run's.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import sys
import threading
import time
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from bench import sim


class Device:
    """The simulated model, recording each batch: when it ended, how long it
    ran, and the inputs it ran (each a unique request number)."""

    def __init__(self, fixed_ms: float, per_item_ms: float) -> None:
        self.fixed_ms = fixed_ms
        self.per_item_ms = per_item_ms
        self.batches: List[Tuple[float, float, List[int]]] = []
        self.lock = threading.Lock()

    def __call__(self, batch: List[int]) -> List[int]:
        started = time.monotonic()
        outputs = sim.simulate_batch(batch, self.fixed_ms, self.per_item_ms)
        ended = time.monotonic()
        with self.lock:
            self.batches.append((ended, ended - started, list(batch)))
        return outputs


class Clients:
    """``count`` clients in closed loops, each giving up after ``patience``."""

    def __init__(self, call: Callable[[int, float], bool], count: int, patience: float) -> None:
        self.call = call
        self.count = count
        self.patience = patience
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.read: Dict[int, float] = {}  # request number -> when its answer was read
        self.next = 0

    def _number(self) -> int:
        with self.lock:
            self.next += 1
            return self.next

    def loop(self) -> None:
        while not self.stop.is_set():
            n = self._number()
            try:
                answered = self.call(n, self.patience)
            except Exception:  # a timeout, a refusal: given up
                answered = False
            if answered:
                with self.lock:
                    self.read[n] = time.monotonic()

    def run(self, warm_up: float, seconds: float) -> Tuple[float, float]:
        threads = [threading.Thread(target=self.loop, daemon=True) for _ in range(self.count)]
        for thread in threads:
            thread.start()
        start = time.monotonic() + warm_up
        end = start + seconds
        time.sleep(max(0.0, end - time.monotonic()))
        self.stop.set()
        return start, end


def measure(device: Device, clients: Clients, warm_up: float, seconds: float) -> Dict[str, float]:
    start, end = clients.run(warm_up, seconds)
    time.sleep(clients.patience + 0.5)  # answers of the window still coming in
    with clients.lock:
        read = dict(clients.read)
    with device.lock:
        batches = [batch for batch in device.batches if start <= batch[0] < end]
    model_s = sum(seconds_ for _, seconds_, _ in batches)
    wasted_s = sum(seconds_ * sum(n not in read for n in inputs) / len(inputs) for _, seconds_, inputs in batches)
    answered = sum(start <= at < end for at in read.values())
    return {
        "goodput": answered / seconds,
        "wasted": wasted_s / model_s if model_s else 0.0,
        "model_busy": model_s / seconds,
        "inputs_per_s": sum(len(inputs) for _, _, inputs in batches) / seconds,
    }


def run_ours(args: argparse.Namespace, aware: bool) -> Dict[str, float]:
    from streamer_core import ThreadedStreamer

    device = Device(args.fixed_ms, args.per_item_ms)
    streamer = ThreadedStreamer(device, args.batch_size, args.max_latency, timeout=20.0, name="goodput")

    def call(n: int, patience: float) -> bool:
        if aware:
            return streamer.predict([n], timeout=patience) == [n]
        future = streamer.submit([n])
        done, _ = concurrent.futures.wait([future], timeout=patience)  # waits without giving the call up
        return bool(done)

    try:
        return measure(device, Clients(call, args.clients, args.patience), args.warm_up, args.seconds)
    finally:
        streamer.close(0.1)  # the unaware run's queue is long: its calls fail at once


def run_theirs(args: argparse.Namespace) -> Optional[Dict[str, float]]:
    try:
        import service_streamer
    except ImportError:
        return None
    device = Device(args.fixed_ms, args.per_item_ms)
    streamer = service_streamer.ThreadedStreamer(device, args.batch_size, args.max_latency)

    def call(n: int, patience: float) -> bool:
        return bool(streamer.submit([n]).result(timeout=patience) == [n])

    figures = measure(device, Clients(call, args.clients, args.patience), args.warm_up, args.seconds)
    streamer._worker_destroy_event.set()  # its worker stops after the batch in hand; the queue is dropped
    return figures


def parse_args(argv: Optional[Sequence[str]]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.goodput_bench", description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=600)
    parser.add_argument("--patience", type=float, default=1.0, help="seconds a client waits before it retries")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--max-latency", type=float, default=0.02, help="seconds")
    parser.add_argument("--fixed-ms", type=float, default=40.0)
    parser.add_argument("--per-item-ms", type=float, default=2.0)
    parser.add_argument("--seconds", type=float, default=15.0, help="measured, per variant")
    parser.add_argument("--warm-up", type=float, default=5.0, help="seconds of load before measuring")
    return parser.parse_args(argv)


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    capacity = args.batch_size / ((args.fixed_ms + args.per_item_ms * args.batch_size) / 1000)
    print(
        f"{args.clients} clients, patience {args.patience} s, then a retry; the model serves about "
        f"{capacity:.0f} inputs/s (batch {args.batch_size}, {args.fixed_ms} ms + {args.per_item_ms} ms an input); "
        f"{args.seconds:.0f} s measured per variant after {args.warm_up:.0f} s",
        flush=True,
    )
    results = {"ours": run_ours(args, aware=True), "ours, unaware": run_ours(args, aware=False)}
    theirs = run_theirs(args)
    if theirs is not None:
        results["service_streamer 0.1.2"] = theirs
    print("| variant | answers read/s | model time wasted | model busy | inputs run/s |")
    print("| --- | --: | --: | --: | --: |")
    for name, run in results.items():
        print(
            f"| {name} | {run['goodput']:.0f} | {run['wasted'] * 100:.1f}% | {run['model_busy'] * 100:.0f}% | "
            f"{run['inputs_per_s']:.0f} |"
        )
    ours, before = results["ours"], results["ours, unaware"]
    print(f"- ours: model time wasted <= 5%: {'PASS' if ours['wasted'] <= 0.05 else 'MISS'} ({ours['wasted']:.1%})")
    print(f"- goodput >= 1.5x the unaware run's: {_times(ours['goodput'], before['goodput'], 1.5)}")
    if theirs is not None:
        print(f"- goodput against service_streamer 0.1.2: {_times(ours['goodput'], theirs['goodput'], 1.5)}")
    return 0


def _times(ours: float, other: float, floor: float) -> str:
    """``ours`` as a multiple of ``other``, judged against ``floor``."""
    if not other:
        return f"{'PASS' if ours else 'MISS'} (the other read no answer at all)"
    ratio = ours / other
    return f"{'PASS' if ratio >= floor else 'MISS'} ({ratio:.1f}x)"


if __name__ == "__main__":
    sys.exit(main())
