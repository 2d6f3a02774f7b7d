"""Run under ``monkey.patch_all()``: a thread-backend model that refuses
some inputs (as a bad token id or a corrupt picture is refused). Prints one
JSON line: what each caller got. What the program writes to stderr is the
test's to read: an input the model refuses is the caller's error, not a
traceback in the server's log."""

from gevent import monkey

monkey.patch_all()

import json  # noqa: E402

import gevent  # noqa: E402

from streamer_core import ThreadedStreamer  # noqa: E402


class Refused(ValueError):
    pass


def double(batch):
    if any(x < 0 for x in batch):
        raise Refused(f"no negative numbers: {batch}")
    return [x * 2 for x in batch]


def main() -> None:
    streamer = ThreadedStreamer(double, batch_size=8, max_latency=0.01)

    def call(x):
        try:
            return streamer.predict([x])[0]
        except Refused as exc:
            return f"refused: {exc}"

    callers = [gevent.spawn(call, x) for x in (1, -1, 2, -2, 3)]
    gevent.joinall(callers, timeout=30)
    streamer.close()
    print(json.dumps([c.value for c in callers]))


if __name__ == "__main__":
    main()
