"""Where one batch's cycle goes on the Redis backend, when every caller is in
the batch (64 clients, batch 64: ``redis_bench``'s ``redis1w-64c``).

With as many clients as ``batch_size``, no batch can start before the last
caller of the previous one has been answered and has come back, so each
cycle is the model's time plus a round trip: the worker writes the answers,
the web process reads them and wakes its callers, they call again, the web
process sends their requests, the worker reads them and starts the model.
This script times those steps from hooks on both sides (wrapped methods,
each writing ``time.monotonic()``, which is one clock for every process on
the machine: this is a diagnostic, not a benchmark of the library's speed).
Every time is in ms after the model's end, the medians over full cycles:

    queued       the worker's model thread has handed the answers to its writer
    writing      the writer starts on them
    written      the worker's answers are in Redis (and their requests acknowledged)
    read         the web process has read them
    delivered    ... and handed each to its call
    first put    the first caller is back with its next call
    last put     the last one is
    first send   the web process starts sending requests (sends: how many)
    last sent    ... and the last of them is in Redis
    worker read  the worker has read the last of them (reads: how many)
    model        the model starts the next batch
    cycle        ... and ends it

and the web process's CPU time per call (every thread, the callers' loop
and the hooks included: compare it between versions, not with a server).

Run from the repository root (needs ``redis-server`` on PATH)::

    .venv/bin/python -m bench.redis_cycle --seconds 8
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import shutil
import signal
import statistics
import sys
import tempfile
import time
from typing import Any, Dict, List, Optional, Sequence, Tuple

from . import sim
from .harness import PrivateRedis
from .process_cycle import run_callers

FIXED_MS, PER_ITEM_MS, BATCH = 10.0, 0.2, 64
PREFIX = "cycle"

Event = Tuple[str, float, int]  # (what, when, how many)


def _worker(url: str, log_path: str) -> None:
    """The worker process: a RedisWorker whose steps are logged."""
    from streamer_core.backends.redis import answers as redis_answers
    from streamer_core.backends.redis import model_loop as redis_model_loop
    from streamer_core.backends.redis import reader as redis_reader
    from streamer_core.backends.redis import worker as redis_worker

    log = open(log_path, "a", buffering=1)  # noqa: SIM115 - kept for the process's life

    def note(what: str, count: int = 0) -> None:
        log.write(f"{what} {time.monotonic()} {count}\n")

    loop: Any = redis_model_loop.ModelLoop
    handover: Any = redis_reader.Handover
    writer: Any = redis_answers.AnswerWriter
    add, answer, run_batch, entries = handover.add, writer._answer, loop._run, writer._entries

    def logged_run(self: Any, predict: Any, batch: Any) -> Any:
        outcome = run_batch(self, predict, batch)
        note("queued")
        return outcome

    def logged_entries(self: Any, *args: Any) -> Any:
        note("writing")
        return entries(self, *args)

    def logged_add(self: Any, inputs: Any, alone: bool = False) -> None:
        note("worker read", len(inputs))
        add(self, inputs, alone)

    def logged_answer(self: Any, *args: Any) -> Any:
        done = answer(self, *args)
        note("written")
        return done

    handover.add, loop._run = logged_add, logged_run
    writer._answer, writer._entries = logged_answer, logged_entries
    run = sim.make_predict(FIXED_MS, PER_ITEM_MS)

    def predict(batch: List[Any]) -> List[Any]:
        note("model", len(batch))
        outputs = run(batch)
        note("model end", len(batch))
        return outputs

    redis_worker.RedisWorker(predict, BATCH, 0.1, url, prefix=PREFIX).run_forever()


def _hook_web(events: List[Event]) -> None:
    from streamer_core.backends.redis import collector, sender
    from streamer_core.batching import scheduler

    reading: Any = collector.ResultCollector
    sending: Any = sender.RequestSender
    on_results, send, put = reading._on_results, sending.send, scheduler.Scheduler.put

    def logged_on_results(self: Any, entries: Any, pipe: Any) -> None:
        events.append(("read", time.monotonic(), len(entries)))
        on_results(self, entries, pipe)
        events.append(("delivered", time.monotonic(), 0))

    def logged_send(self: Any, entries: Any, give_up_at: float) -> Any:
        events.append(("send", time.monotonic(), len(entries)))
        failure = send(self, entries, give_up_at)
        events.append(("sent", time.monotonic(), len(entries)))
        return failure

    def logged_put(self: Any, *args: Any, **kwargs: Any) -> Any:
        future = put(self, *args, **kwargs)
        events.append(("put", time.monotonic(), 0))
        return future

    reading._on_results, sending.send = logged_on_results, logged_send
    scheduler.Scheduler.put = logged_put  # type: ignore[method-assign]


STAGES = (
    "queued",
    "writing",
    "written",
    "read",
    "delivered",
    "first put",
    "last put",
    "first send",
    "sends",
    "last sent",
    "worker read",
    "reads",
    "model",
    "cycle",
)


def cycles(events: Sequence[Event]) -> List[Dict[str, float]]:
    """Each full cycle's steps, in seconds after the model's end (see STAGES)."""
    ends = [i for i, (what, _, count) in enumerate(events) if what == "model end" and count == BATCH]
    found = []
    for start, end in zip(ends, ends[1:]):
        span, t0 = events[start : end + 1], events[start][1]

        def times(what: str) -> List[float]:
            return [when - t0 for kind, when, _ in span if kind == what]  # noqa: B023 - used at once

        puts, sends, reads, models = times("put"), times("send"), times("worker read"), times("model")
        if len(puts) < BATCH or not sends or not reads or not models or not times("written") or not times("read"):
            continue  # not a cycle of one full batch
        found.append(
            {
                "queued": times("queued")[0],
                "writing": times("writing")[0],
                "written": times("written")[0],
                "read": times("read")[0],
                "delivered": times("delivered")[0],
                "first put": puts[0],
                "last put": puts[-1],
                "first send": sends[0],
                "sends": len(sends),
                "last sent": times("sent")[-1],
                "worker read": reads[-1],
                "reads": len(reads),
                "model": models[-1],
                "cycle": span[-1][1] - t0,
            }
        )
    return found


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.redis_cycle", description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=8.0, help="how long the 64 clients run (default 8)")
    parser.add_argument("--redis-server", default=shutil.which("redis-server"), help="the redis-server binary")
    args = parser.parse_args(argv)
    if not args.redis_server:
        raise SystemExit("redis-server not found: install it or pass --redis-server PATH")
    events: List[Event] = []
    _hook_web(events)
    from streamer_core import RedisStreamer

    with tempfile.TemporaryDirectory() as folder:
        server = PrivateRedis(args.redis_server, folder)
        server.start()
        url, log_path = f"127.0.0.1:{server.port}", os.path.join(folder, "worker.log")
        worker = multiprocessing.get_context("spawn").Process(target=_worker, args=(url, log_path), daemon=True)
        try:
            worker.start()
            streamer = RedisStreamer(url, prefix=PREFIX)
            if not streamer.wait_ready(60):
                raise SystemExit("the worker did not start")
            cpu = time.process_time()
            answered, elapsed = run_callers(streamer, args.seconds, BATCH)
            cpu = time.process_time() - cpu
            streamer.close()
        finally:
            if worker.pid is not None and worker.is_alive():
                os.kill(worker.pid, signal.SIGTERM)
            worker.join(10)
            if worker.is_alive():
                worker.kill()
            server.stop()
        with open(log_path) as handle:
            for line in handle:
                what, when, count = line.rsplit(" ", 2)
                events.append((what, float(when), int(count)))
    events.sort(key=lambda event: event[1])
    found = cycles(events)
    if not found:
        print("no full cycle was seen", file=sys.stderr)
        return 1
    ideal = BATCH / ((FIXED_MS + PER_ITEM_MS * BATCH) / 1000)
    print(f"{len(found)} cycles of {BATCH} calls; ms after the model's end, medians")
    for stage in STAGES:
        value = statistics.median(cycle[stage] for cycle in found)
        print(f"  {stage:12s} {value:7.0f}" if stage in ("sends", "reads") else f"  {stage:12s} {value * 1000:7.3f}")
    print(f"  throughput   {answered / elapsed / ideal:7.3f} of ideal")
    print(f"  web CPU      {cpu / answered * 1e6:7.1f} us per call (this process, all threads, hooks included)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
