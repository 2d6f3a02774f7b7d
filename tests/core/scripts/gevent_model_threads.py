"""Run under ``monkey.patch_all()``: a thread-backend model with
``model_threads`` N (the first argument) whose every batch waits, on a real
OS barrier, until N batches run at once, as N device calls would. Prints one
JSON line: the results and the most batches seen running at once."""

import sys

from gevent import monkey

monkey.patch_all()

import json  # noqa: E402
import threading  # noqa: E402

import gevent  # noqa: E402

from streamer_core import ThreadedStreamer  # noqa: E402

# The unpatched ones: the batches run on real threads of gevent's pool.
Barrier = monkey.get_original("threading", "Barrier")
Lock = monkey.get_original("threading", "Lock")


def main() -> None:
    threads = int(sys.argv[1])
    together = Barrier(threads, timeout=20)
    lock = Lock()
    running = [0, 0]  # now, most

    def predict(batch):
        with lock:
            running[0] += 1
            running[1] = max(running[1], running[0])
        together.wait()
        with lock:
            running[0] -= 1
        return [x * 2 for x in batch]

    streamer = ThreadedStreamer(predict, batch_size=1, max_latency=0.0, model_threads=threads)
    callers = [gevent.spawn(streamer.predict, [i]) for i in range(2 * threads)]
    gevent.joinall(callers, timeout=60)
    streamer.close()
    assert threading.current_thread() is threading.main_thread()
    print(json.dumps({"results": [c.value for c in callers], "most_at_once": running[1]}))


if __name__ == "__main__":
    main()
