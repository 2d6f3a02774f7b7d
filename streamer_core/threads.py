"""The streamer's own OS threads: :func:`background`.

A signal sent to a process (SIGTERM from a server's master or from
``kill``, Ctrl-C's SIGINT) is delivered to any one of its threads that does
not block it, and Python runs its handler in the main thread only, when
that thread next runs Python. A main thread asleep in a lock wait (granian's
worker waits so for its stop, a spawned model worker for its next batch)
is woken only by a signal delivered to it: one delivered to a model or
dispatch thread leaves the handler pending, and the process running, for
good. So the threads started here block the signals a server uses to
control a process before they run anything, and every thread they start in
turn (torch's, the tokenizer's) inherits that mask: the kernel then
delivers those signals to the main thread or to a thread the program made.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from typing import Any, Callable, Tuple

__all__ = ["PROCESS_SIGNALS", "background", "block_process_signals"]

#: Process-directed signals a server or a terminal uses to control a
#: process: left to the main thread (and the threads the program itself made).
PROCESS_SIGNALS = frozenset(
    getattr(signal, name)
    for name in (
        "SIGINT",
        "SIGTERM",
        "SIGQUIT",
        "SIGHUP",
        "SIGUSR1",
        "SIGUSR2",
        "SIGWINCH",
        "SIGTTIN",
        "SIGTTOU",
        "SIGCHLD",
        "SIGALRM",
    )  # fmt: skip
    if hasattr(signal, name)
)


def block_process_signals() -> None:
    """Block :data:`PROCESS_SIGNALS` in the calling OS thread, unless it is
    the process's main thread (a greenlet under gevent's monkey-patching
    runs there: blocking them would keep the server from its own signals).
    Does nothing where the platform cannot (no ``pthread_sigmask``)."""
    if not hasattr(signal, "pthread_sigmask"):
        return
    if _on_main_thread():
        return
    signal.pthread_sigmask(signal.SIG_BLOCK, PROCESS_SIGNALS)


def _on_main_thread() -> bool:
    """Whether the calling OS thread is the process's main one. On Linux
    that is the thread whose id is the process's: true in a forked child
    too (its one thread is the forking one), where the library was first
    imported after the fork and ``threading.main_thread().native_id`` names
    the parent's thread (CPython 3.11: a gevent gunicorn worker, its app
    imported after the fork, blocked its own SIGTERM and was killed at its
    graceful timeout). Elsewhere, the main thread's id as recorded."""
    native = threading.get_native_id()
    return native == _main_native_id or (sys.platform == "linux" and native == os.getpid())


def background(target: Callable[..., Any], name: str, args: Tuple[Any, ...] = ()) -> threading.Thread:
    """A daemon thread named ``name`` running ``target(*args)`` with the
    process's control signals blocked (:func:`block_process_signals`);
    not started."""

    def run() -> None:
        block_process_signals()
        target(*args)

    return threading.Thread(target=run, name=name, daemon=True)


def _native_id_of_main() -> int:
    native = threading.main_thread().native_id
    return native if native is not None else -1


#: The OS thread id of the process's main thread. After a fork the child's
#: main thread is the one that forked, but ``threading.main_thread().native_id``
#: still names the parent's (CPython 3.11): a gunicorn worker had its one OS
#: thread's signals blocked, and never quit on Ctrl-C. Made again in the child.
_main_native_id = _native_id_of_main()


def _after_fork_in_child() -> None:
    global _main_native_id
    _main_native_id = threading.get_native_id()  # the forking thread: the child's main one


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
