"""What writing a response costs the thread that sends it, the way gevent's
HTTP server writes one and the way ``streamer_core.web.writing`` does.

gevent's ``WSGIHandler`` sends a response's header block with one
``sendall`` and its body with another; each ``sendall`` of a gevent socket
calls ``getsockopt`` before it sends. ``streamer_core.web.writing`` joins a
body of up to 64 KiB to its headers and sends them with one ``send``. Here
a gevent socket connected over loopback to a thread that drains it sends
``--responses`` responses of an embedding's size (a 110-byte header block,
a 7,000-byte JSON body) each way, in interleaved rounds; printed is the
sending thread's CPU (``time.thread_time``: its own time and the system
time of its calls, which over loopback includes handing the bytes to the
receiver) per response, the median of the rounds. Pin it to one core so
the rounds compete with nothing but each other::

    taskset -c 0 .venv/bin/python -m bench.send_bench
    taskset -c 0 .venv/bin/python -m bench.send_bench --body 70000   # past the 64 KiB joined
"""

from __future__ import annotations

import argparse
import socket
import statistics
import sys
import threading
import time
from typing import Dict, List, Optional, Sequence

from streamer_core.web.writing import JOINED_BODY_MOST

HEAD = (
    b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 7000\r\n"
    b"Date: Sat, 28 Nov 2026 03:24:22 GMT\r\n\r\n"
)
WAYS = ("gevent", "one-send")


def per_response_us(way: str, body: bytes, responses: int) -> float:
    """The sending thread's CPU µs per response, written ``way``."""
    from gevent import socket as green

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    reader = socket.create_connection(listener.getsockname())
    accepted, _ = listener.accept()
    sender = green.socket(fileno=accepted.detach())

    def drain() -> None:
        while reader.recv(1 << 20):
            pass

    draining = threading.Thread(target=drain, daemon=True)
    draining.start()
    started = time.thread_time()
    for _ in range(responses):
        if way == "gevent":
            sender.sendall(HEAD)
            sender.sendall(body)
        else:  # as streamer_core.web.writing does: a body it joins, or one it sends after the headers
            blocks = [bytearray(HEAD) + body] if len(body) <= JOINED_BODY_MOST else [HEAD, body]
            for block in blocks:
                sent = sender.send(block)
                if sent < len(block):
                    sender.sendall(memoryview(block)[sent:])
    spent = time.thread_time() - started
    sender.close()
    draining.join(10)
    reader.close()
    listener.close()
    return spent / responses * 1e6


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--responses", type=int, default=20000, help="responses a round (default 20000)")
    parser.add_argument("--rounds", type=int, default=7, help="interleaved rounds (default 7)")
    parser.add_argument("--body", type=int, default=7000, help="bytes of each body (default 7000)")
    args = parser.parse_args(argv)
    body = b"x" * args.body
    found: Dict[str, List[float]] = {way: [] for way in WAYS}
    for _ in range(args.rounds):
        for way in WAYS:
            found[way].append(per_response_us(way, body, args.responses))
    for way in WAYS:
        rounds = ", ".join(f"{value:.1f}" for value in found[way])
        print(f"{way:9} {statistics.median(found[way]):6.2f} µs a response (rounds: {rounds})")
    ratio = statistics.median(found["one-send"]) / statistics.median(found["gevent"])
    print(f"one send costs {ratio:.2f}x gevent's two")
    return 0


if __name__ == "__main__":
    sys.exit(main())
