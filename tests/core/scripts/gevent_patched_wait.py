"""Under ``monkey.patch_all()``, greenlets wait for their batch on the hub's
shared watcher (``streamer_core.green``), as unpatched: prints one JSON line
of what the checks in ``test_gevent_patched.py`` need.

The model is a simulated device: it sleeps through libc on its own OS thread
(the GIL released, gevent never yielded to). 48 greenlets each call once;
some wait as the web layers' ``wait_call`` does with a client socket, which
waits ``FIRST_LOOK_S`` and then again (the model takes longer than that)."""

from gevent import monkey

monkey.patch_all()

import ctypes  # noqa: E402
import json  # noqa: E402
import time  # noqa: E402

import gevent  # noqa: E402

import streamer_core.green as green  # noqa: E402
from streamer_core import ThreadedStreamer  # noqa: E402
from streamer_core.web.peer import FIRST_LOOK_S, wait_call  # noqa: E402

LIBC = ctypes.CDLL(None)
MODEL_SECONDS = 3 * FIRST_LOOK_S
batches = []
wakes = []


def model(batch):
    batches.append(len(batch))
    LIBC.usleep(int(MODEL_SECONDS * 1e6))
    return [x * 2 for x in batch]


switch_ready = green._Waker._switch_ready


def counted(self):
    wakes.append(len(self._ready))
    switch_ready(self)


green._Waker._switch_ready = counted


class OpenSocket:
    def fileno(self):
        return -1  # peer_closed: no descriptor, never closed


streamer = ThreadedStreamer(model, batch_size=64, max_latency=0.02)
futures, answers, took = [], {}, {}


def call(i, looks):
    future = streamer.submit([i])
    futures.append(future)
    start = time.monotonic()
    answers[i] = wait_call(future, OpenSocket()) if looks else future.result()
    took[i] = time.monotonic() - start


gevent.joinall([gevent.spawn(call, i, i % 2 == 0) for i in range(48)], timeout=30)
streamer.close()
print(
    json.dumps(
        {
            "patched": monkey.is_module_patched("threading"),
            "answers": [answers.get(i) for i in range(48)],
            "batches": batches,
            "wakes": wakes,
            "conditions": sum("_condition" in future.__dict__ for future in futures),
            "slowest": max(took.values()),
        }
    )
)
