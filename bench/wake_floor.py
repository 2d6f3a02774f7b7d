"""How long this machine takes to wake N Python threads and have each come
back: the floor under a closed-loop round trip of N callers, whatever the
library between them and the model.

In ``redis_bench``'s ``redis1w-64c`` (64 clients, batches of 64) no batch
can start before the last caller of the previous one has been answered and
has called again, so each cycle is the model's 22.8 ms plus a round trip,
and 0.85 of ideal leaves that round trip 4.0 ms. Part of it is not the
library's at all: 64 threads blocked on their calls must each be woken, take
the GIL in turn and block again. This script times exactly that, with no
Redis, no streamer and no model: a driver releases N locks (one per thread,
as an answered call releases its caller), each thread does ``--work-us`` of
pure Python (a stand-in for building its next call) and reports back, and
the driver waits for all N. Printed: wall ms per round (the floor for N
callers), and CPU µs per wake-up (the woken threads' own time, then the
whole process's).

Run from the repository root::

    .venv/bin/python -m bench.wake_floor                 # 64 threads, 300 rounds, 3 runs
    .venv/bin/python -m bench.wake_floor --threads 128 --work-us 0
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time
from typing import List, Optional, Sequence, Tuple


def _spin(microseconds: float) -> None:
    """Hold the GIL doing pure Python for about ``microseconds``."""
    end = time.perf_counter() + microseconds / 1e6
    while time.perf_counter() < end:
        pass


def run(threads: int, rounds: int, work_us: float) -> Tuple[float, float, float]:
    """One run: (wall ms per round, woken threads' CPU µs per wake-up,
    process CPU µs per wake-up)."""
    gates = [threading.Lock() for _ in range(threads)]
    for gate in gates:
        gate.acquire()
    back = threading.Semaphore(0)
    cpu = [0.0] * threads

    def caller(index: int) -> None:
        gate, spent = gates[index], 0.0
        for _ in range(rounds):
            started = time.thread_time()
            if not gate.acquire(timeout=30):
                raise RuntimeError("a thread was not woken within 30 s")
            spent += time.thread_time() - started
            _spin(work_us)
            back.release()
        cpu[index] = spent

    workers = [threading.Thread(target=caller, args=(i,), daemon=True) for i in range(threads)]
    for worker in workers:
        worker.start()
    wall, process = time.perf_counter(), time.process_time()
    for _ in range(rounds):
        for gate in gates:
            gate.release()
        for _ in range(threads):
            if not back.acquire(timeout=30):
                raise RuntimeError("a thread did not come back within 30 s")
    wall, process = time.perf_counter() - wall, time.process_time() - process
    for worker in workers:
        worker.join(30)
    wakes = threads * rounds
    return wall / rounds * 1e3, sum(cpu) / wakes * 1e6, process / wakes * 1e6


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.wake_floor", description=__doc__.split("\n")[0])
    parser.add_argument("--threads", type=int, default=64, help="threads woken each round (default 64)")
    parser.add_argument("--rounds", type=int, default=300, help="rounds per run (default 300)")
    parser.add_argument("--runs", type=int, default=3, help="runs; the median is shown (default 3)")
    parser.add_argument("--work-us", type=float, default=10.0, help="pure Python each thread does when woken")
    args = parser.parse_args(argv)
    if args.threads < 1 or args.rounds < 1 or args.runs < 1 or args.work_us < 0:
        parser.error("--threads, --rounds and --runs must be at least 1, --work-us at least 0")
    results: List[Tuple[float, float, float]] = [run(args.threads, args.rounds, args.work_us) for _ in range(args.runs)]
    per_round, woken, process = (statistics.median(values) for values in zip(*results))
    print(
        f"{args.threads} threads, {args.work_us:g} us of work each, {args.rounds} rounds x {args.runs} runs (median)\n"
        f"  wall per round      {per_round:7.2f} ms   (runs: {', '.join(f'{r[0]:.2f}' for r in results)})\n"
        f"  CPU per wake-up     {woken:7.1f} us   (the woken thread's own)\n"
        f"  process CPU         {process:7.1f} us   per wake-up, the driver included"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
