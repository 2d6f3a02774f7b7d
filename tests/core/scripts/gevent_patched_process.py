"""Run under ``monkey.patch_all()``, as gunicorn's gevent workers run: a
process-backend streamer with one worker, fed by 40 greenlets at once for
five rounds: a third with strings of 256 KiB, so that a batch fills the
pipe, a third with arrays of 256 KiB, which go through shared memory both
ways (the worker's pipe reader frees its result blocks), the rest small
numbers. Prints one JSON line: how many calls came back
right, the errors, and the worker's pids before and after.

The worker imports this script again (as ``__mp_main__``): with
``PATCH_WORKERS_TOO=1`` in the environment it patches the worker as well, as
a ``patch_all()`` at the top of a served script does; without, only this
process is patched, as under gunicorn."""

import os
import sys
from pathlib import Path

from gevent import monkey

if __name__ == "__main__" or os.environ.get("PATCH_WORKERS_TOO") == "1":
    monkey.patch_all()

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))  # the workers import tests.core.models

import json  # noqa: E402

import gevent  # noqa: E402
import numpy as np  # noqa: E402

from streamer_core import Streamer  # noqa: E402
from tests.core.models import double  # noqa: E402

CALLERS = 42
ROUNDS = 5


def one_input(i, round_):
    if i % 3 == 0:
        return f"{round_}" + "x" * (256 * 1024)
    if i % 3 == 1:
        return np.full(64 * 1024, i + round_, dtype=np.float32)
    return i + round_


def same(got, expected):
    if isinstance(expected, np.ndarray):
        return isinstance(got, np.ndarray) and np.array_equal(got, expected)
    return got == expected


def main() -> None:
    streamer = Streamer(double, batch_size=8, max_latency=0.01, worker_num=1, shared_memory_min_bytes=64 * 1024)
    assert streamer.wait_ready(30), "the worker did not start"
    before = streamer.worker_pids()
    right, errors = 0, []
    for round_ in range(ROUNDS):
        inputs = [one_input(i, round_) for i in range(CALLERS)]
        calls = [gevent.spawn(streamer.predict, [value], timeout=20) for value in inputs]
        gevent.joinall(calls, timeout=60)
        for value, call in zip(inputs, calls):
            if call.successful() and same(call.value[0], value * 2):
                right += 1
            else:
                errors.append(repr(call.exception)[:300])
    after = streamer.worker_pids()
    streamer.close()
    print(json.dumps({"right": right, "errors": errors[:5], "before": before, "after": after}))


if __name__ == "__main__":
    main()
