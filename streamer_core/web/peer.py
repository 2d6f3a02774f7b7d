"""Noticing that the HTTP client of a request has gone while the request
waits for the model, so that its call is given up (its input dropped
before it is batched, counted as ``disconnected``) rather than run for
nobody.

Two ways, as the server allows:

- ASGI (Django's async views under uvicorn, daphne, hypercorn): the
  server sends ``http.disconnect`` and Django cancels the view's task;
  :func:`await_call` turns that cancellation into the call's disconnection.
- WSGI under gunicorn (its ``sync``, ``gthread`` and ``gevent`` workers):
  the client's socket is ``environ["gunicorn.socket"]`` (``gunicorn.sock``
  under its ``gevent_pywsgi`` worker, the examples'); :func:`wait_call`
  waits for the call and, once it has waited :data:`FIRST_LOOK_S`, peeks at
  the socket every :data:`LOOK_EVERY_S` (one ``recv(MSG_PEEK |
  MSG_DONTWAIT)``, which reads nothing): an orderly close or a reset of the
  peer gives the call up. A request answered sooner costs no system call.
  Other WSGI servers do not hand the socket to the app: nothing is noticed
  there, and the call runs to its answer or its deadline.
"""

from __future__ import annotations

import _socket
import asyncio
import socket
import time
from typing import Any, List, Optional

from ..future import BatchFuture

__all__ = ["FIRST_LOOK_S", "LOOK_EVERY_S", "await_call", "client_socket", "peer_closed", "wait_call"]

#: How long a request waits before its client's socket is first looked at
#: (seconds): most answers come sooner, and cost nothing more.
FIRST_LOOK_S = 0.05
#: How often the socket is looked at after that (seconds).
LOOK_EVERY_S = 0.1


def client_socket(environ: Any) -> Optional[Any]:
    """The client's socket of a WSGI request, where the server gives it
    (gunicorn: ``gunicorn.socket``, or ``gunicorn.sock`` under its
    ``gevent_pywsgi`` worker), else ``None``."""
    if not hasattr(environ, "get"):
        return None
    sock = environ.get("gunicorn.socket") or environ.get("gunicorn.sock")
    return sock if sock is not None and hasattr(sock, "fileno") else None


def peer_closed(sock: Any) -> bool:
    """Whether the peer of ``sock`` has closed its side (or reset it):
    a peek that returns no bytes at once. Never blocks, never yields to
    gevent (the peek is made on the descriptor by the C socket module);
    bytes waiting (a pipelined request) or none yet say it is open."""
    try:
        fd = sock.fileno()
    except (OSError, ValueError):
        return False
    if fd < 0:
        return False
    probe = _socket.socket(fileno=fd)
    try:
        return probe.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
    except (BlockingIOError, InterruptedError):
        return False
    except OSError:  # reset by the peer, or the descriptor is no socket any more
        return True
    finally:
        probe.detach()  # the descriptor stays the server's


def wait_call(future: BatchFuture, sock: Optional[Any]) -> List[Any]:
    """``future.result()``, giving the call up as ``disconnected`` when the
    peer of ``sock`` closes while it waits (see the module's doc)."""
    if sock is None or future._wait_done(FIRST_LOOK_S):
        return future.result()
    while not future._wait_done(LOOK_EVERY_S):
        if peer_closed(sock):
            future.disconnected()
            break
        if time.monotonic() > future._deadline:
            break  # result() ends it now, by the call's deadline
    return future.result()


async def await_call(future: BatchFuture) -> List[Any]:
    """Await ``future`` in an ASGI view: a cancellation of the awaiting task
    (Django cancels the view when the server says the client disconnected)
    gives the call up as ``disconnected``. Not ``asyncio.wrap_future``,
    which would cancel the call first, as a plain ``cancelled``."""
    loop = asyncio.get_running_loop()
    waiter: asyncio.Future[None] = loop.create_future()

    def done(_: Any) -> None:
        try:
            loop.call_soon_threadsafe(_settle, waiter)
        except RuntimeError:  # the loop is closed: nobody awaits it any more
            pass

    future.add_done_callback(done)
    try:
        await waiter
    except asyncio.CancelledError:
        future.disconnected()
        raise
    return future.result(0)


def _settle(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)
