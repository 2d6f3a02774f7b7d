"""Where one batch's cycle goes on the process backend, when every caller
is in the batch (64 clients, batch 64: ``core_bench``'s ``proc1w-64c``).

With as many clients as ``batch_size``, no batch can start before the last
caller of the previous one has been answered and has come back, so each
cycle is the model's time plus a round trip through this process and the
worker. This script times that round trip's stages, from hooks on the
backend and the scheduler (wrapping their methods: this is a diagnostic,
not a benchmark of the library's speed) and a model that logs when it runs:

    decode+deliver     the collector reads the worker's answer and wakes the 64 callers
    last put           the 64 callers come back with their next call
    last put -> sent   the dispatcher forms the batch and writes it to the pipe
    sent -> model      the worker reads and unpickles it
    model              the simulated device (10 ms + 0.2 ms per item)
    model -> answered  the worker pickles the outcomes and the collector wakes

Run from the repository root::

    .venv/bin/python -m bench.process_cycle --seconds 8
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import threading
import time
from typing import Any, List, Optional, Sequence, Tuple

from streamer_core import ManagedModel, Streamer
from streamer_core.backends import process_backend as _process
from streamer_core.backends import process_messages as _messages
from streamer_core.batching import scheduler as _batching

from . import sim

FIXED_MS, PER_ITEM_MS, BATCH = 10.0, 0.2, 64


class TimedModel(ManagedModel):
    """The simulated device, writing when each batch started and ended."""

    def init_model(self, log_path: str) -> None:
        self.run = sim.make_predict(FIXED_MS, PER_ITEM_MS)
        self.log = open(log_path, "a")  # noqa: SIM115 - kept for the worker's life

    def predict(self, batch: List[Any]) -> List[Any]:
        started = time.monotonic()
        outputs = self.run(batch)
        self.log.write(f"{started} {time.monotonic()}\n")
        self.log.flush()
        return outputs


def _hook(events: List[Tuple[str, float]]) -> None:
    on_done, run, put = _messages.WorkerMessages._on_done, _process.ProcessBackend.run, _batching.Scheduler.put

    def timed_on_done(self: Any, *args: Any) -> None:
        events.append(("done", time.monotonic()))
        on_done(self, *args)
        events.append(("delivered", time.monotonic()))

    def timed_run(self: Any, items: Any, held: int) -> None:
        run(self, items, held)
        events.append(("sent", time.monotonic()))

    def timed_put(self: Any, *args: Any, **kwargs: Any) -> Any:
        future = put(self, *args, **kwargs)
        events.append(("put", time.monotonic()))
        return future

    _messages.WorkerMessages._on_done = timed_on_done  # type: ignore[method-assign]
    _process.ProcessBackend.run = timed_run  # type: ignore[method-assign]
    _batching.Scheduler.put = timed_put  # type: ignore[method-assign]


STAGES = ("decode+deliver", "last put", "last put -> sent", "sent -> model", "model", "model -> answered", "cycle")


def cycles(events: Sequence[Tuple[str, float]], model: Sequence[Tuple[float, float]]) -> List[Tuple[float, ...]]:
    """Each full cycle's stages, in seconds (see STAGES)."""
    done_at = [i for i, (kind, _) in enumerate(events) if kind == "done"]
    found = []
    for start, end in zip(done_at, done_at[1:]):
        span = events[start:end]
        delivered = next(t for kind, t in span if kind == "delivered")
        puts = [t for kind, t in span if kind == "put"]
        sent = [t for kind, t in span if kind == "sent"]
        if len(puts) < BATCH or not sent:
            continue  # not a cycle of one full batch
        runs = [m for m in model if sent[0] <= m[0] <= events[end][1]]
        if not runs:
            continue
        began, ended = runs[0]
        found.append(
            (
                delivered - span[0][1],
                puts[-1] - delivered,
                sent[0] - puts[-1],
                began - sent[0],
                ended - began,
                events[end][1] - ended,
                events[end][1] - span[0][1],
            )
        )
    return found


def run_callers(streamer: Any, seconds: float, callers: int = BATCH) -> Tuple[int, float]:
    """``callers`` threads, each calling ``streamer`` with one input of its
    own in a closed loop for ``seconds`` and checking that the answer is its
    own; return how many calls were answered and in how many seconds."""
    stop, answered = time.monotonic() + seconds, [0] * callers

    def client(index: int) -> None:
        base, seq = (index + 1) * 10**9, 0
        while time.monotonic() < stop:
            value = base + seq
            if streamer.submit([value]).result(5) != [value]:
                raise AssertionError("a caller got another caller's answer")
            seq += 1
        answered[index] = seq

    threads = [threading.Thread(target=client, args=(i,)) for i in range(callers)]
    started = time.monotonic()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return sum(answered), time.monotonic() - started


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.process_cycle", description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=8.0, help="how long the 64 clients run (default 8)")
    args = parser.parse_args(argv)
    events: List[Tuple[str, float]] = []
    _hook(events)
    with tempfile.TemporaryDirectory() as folder:
        log_path = os.path.join(folder, "model.log")
        streamer = Streamer(TimedModel, BATCH, 0.1, model_init_kwargs={"log_path": log_path})
        streamer.wait_ready(60)
        run_callers(streamer, args.seconds)
        streamer.close()
        with open(log_path) as handle:
            model = [(float(a), float(b)) for a, b in (line.split() for line in handle)]
    found = cycles(events, model)
    if not found:
        print("no full cycle was seen", file=sys.stderr)
        return 1
    ideal = (FIXED_MS + PER_ITEM_MS * BATCH) / 1000
    print(f"{len(found)} cycles of {BATCH} calls; medians in ms")
    for index, stage in enumerate(STAGES):
        print(f"  {stage:20s} {statistics.median(c[index] for c in found) * 1000:7.3f}")
    print(f"  of ideal            {ideal / statistics.median(c[-1] for c in found):7.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
