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

# The unpatched ones: the batches run on real threads of gevent's pool. Not
# threading.Barrier, even the original class: its Condition takes
# threading's (patched) lock, a gevent lock that real threads cannot share.
Lock = monkey.get_original("_thread", "allocate_lock")
sleep = monkey.get_original("time", "sleep")
monotonic = monkey.get_original("time", "monotonic")


def main() -> None:
    threads = int(sys.argv[1])
    lock = Lock()
    running = [0, 0, 0]  # now, most, arrived so far

    def predict(batch):
        """Wait (blocking the real thread, at most 20 s) until the round of
        ``threads`` batches this one belongs to has all arrived."""
        with lock:
            running[0] += 1
            running[1] = max(running[1], running[0])
            running[2] += 1
            round_full = -(-running[2] // threads) * threads
        deadline = monotonic() + 20
        while running[2] < round_full and monotonic() < deadline:
            sleep(0.001)
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
