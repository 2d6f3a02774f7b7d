"""Waiting for a result inside a gevent greenlet without blocking the hub.

Under gevent *without* ``monkey.patch_all()`` (gevent's ``WSGIServer`` run
as it is, for instance), every request is a greenlet on one OS thread. A
plain lock wait in a view blocks that thread, so the server accepts nothing
else until the model answers and batches never grow past one request.
service_streamer's batched endpoint collapses that way.

The streamer's own threads are real OS threads then, so a greenlet cannot
wait on a gevent primitive that they set (gevent objects are not safe across
threads). It waits instead on an event-loop *async watcher*, the one gevent
object that another thread may signal; completing the future sends it.

With ``threading`` monkey-patched (gunicorn's gevent workers), a lock wait
yields to the hub already, but each lock released by the model's thread
costs the hub a cross-thread callback and each wait a ``Timeout`` of its
own; the shared watcher wakes a batch's greenlets with one signal. Under
``patch_all()``, greenlets calling a thread-backend streamer spent less
CPU a call this way than by the lock and made more calls a second (the
docs' Performance page). So a greenlet waits here, patched or not.
gevent is imported only if the program has imported it.
"""

from __future__ import annotations

import importlib
import sys
import threading
import weakref
from collections import deque
from functools import partial
from typing import Any, Callable, Deque, Optional, Tuple

__all__ = ["Condition", "in_greenlet", "green_waiter", "wait_green", "unpatched"]


def in_greenlet() -> bool:
    """Whether this code runs in a gevent greenlet, monkey-patched or not:
    unpatched, a lock wait there would block every other greenlet; patched,
    it would cost more than a waiter on the hub's shared watcher."""
    gevent = sys.modules.get("gevent")
    if gevent is None:
        return False
    current = gevent.getcurrent()
    if isinstance(current, gevent.Greenlet):
        return True
    # The main greenlet, or one from spawn_raw: cooperative if this thread
    # runs a hub (and we are not in the hub itself, which must never wait).
    hub = _hub_if_exists()
    return hub is not None and current is not hub


def unpatched(module: str, name: str) -> Any:
    """``module.name`` as it was before gevent's monkey-patching (as it is,
    where nothing patched it): an OS thread, lock or sleep for code that must
    block its own thread and not yield to a hub."""
    monkey = sys.modules.get("gevent.monkey")
    if monkey is not None:
        return monkey.get_original(module, name)
    return getattr(importlib.import_module(module), name)


class Condition(threading.Condition):
    """``threading.Condition`` over a plain lock (made here when none is
    given) whose ``notify()`` never yields while the lock is held.

    The standard one asks whether the caller holds a plain lock by trying to
    take it without blocking. Under gevent's ``monkey.patch_all()`` the lock
    is gevent's, which yields to the hub when such a try fails, so every
    ``notify()`` let other greenlets run while the notifier still held the
    lock: they found it taken, queued on it, and lost it again to the
    notifier's next turn (gevent's locks are not fair). A dispatcher that
    notified in a loop kept a web process's collector off its lock for
    seconds at a time, at 100% CPU. Here the check is that the lock is held,
    which is what ``notify()`` and ``wait()`` require of a caller (and all
    the standard check can tell of a plain lock, which has no owner)."""

    def __init__(self, lock: Optional[Any] = None) -> None:
        lock = threading.Lock() if lock is None else lock
        super().__init__(lock)
        self._held = lock.locked

    def _is_owned(self) -> bool:
        return bool(self._held())


def _hub_if_exists() -> Optional[object]:
    try:
        from gevent._hub_local import get_hub_if_exists
    except ImportError:  # an older or newer gevent: only Greenlets are detected
        return None
    hub: Optional[object] = get_hub_if_exists()
    return hub


def green_waiter() -> Tuple[Callable[[], None], Any, object]:
    """A waiter for the current greenlet, a function that wakes it, which
    any thread may call (``wake()`` queues the waiter on its hub's
    :class:`_Waker`), and that greenlet. Pass the waiter to
    :func:`wait_green`."""
    get_hub, waiter_class, getcurrent = _gevent_parts()
    hub = get_hub()
    waiter = waiter_class(hub)
    return partial(_waker_of(hub).wake, waiter), waiter, getcurrent()


def wait_green(waiter: Any, timeout: float) -> None:
    """Yield to the hub until ``waiter`` is woken or ``timeout`` seconds
    pass; other greenlets run meanwhile. A wake that comes after the
    timeout only stores a value in a waiter nobody waits on: harmless.

    The timer counts from now, not from the loop's clock: gevent's loop reads
    the time when it runs, and a timer started from that clock after the
    thread kept the loop from running (a model loading, a long computation,
    a busy greenlet) fired that much early, at once after a pause longer
    than the timeout (gevent's own ``Timeout`` updates the clock too)."""
    timer = waiter.hub.loop.timer(timeout)
    timer.start(waiter.switch, None, update=True)
    try:
        waiter.get()
    finally:
        timer.close()


_parts: Optional[Tuple[Callable[[], Any], Callable[[Any], Any], Callable[[], object]]] = None


def _gevent_parts() -> Tuple[Callable[[], Any], Callable[[Any], Any], Callable[[], object]]:
    """gevent's ``get_hub``, ``Waiter`` and ``getcurrent``, imported once
    (only ever called with gevent imported already)."""
    global _parts
    if _parts is None:
        from gevent import getcurrent
        from gevent.hub import Waiter, get_hub

        _parts = (get_hub, Waiter, getcurrent)
    return _parts


class _Waker:
    """One async watcher per hub, shared by every waiting greenlet: a thread
    that completes a future queues the greenlet's waiter and signals the
    watcher; the hub then switches to each queued waiter. Signals sent
    before the hub runs coalesce, so a batch of 64 results wakes the hub
    once, not 64 times."""

    def __init__(self, hub: object) -> None:
        self._ready: Deque[object] = deque()
        self._watcher = hub.loop.async_()  # type: ignore[attr-defined]
        self._watcher.ref = False  # waiting greenlets keep the hub running, not this watcher
        self._watcher.start(self._switch_ready)

    def wake(self, waiter: object) -> None:  # any thread
        self._ready.append(waiter)
        self._watcher.send()

    def _switch_ready(self) -> None:  # in the hub
        ready = self._ready
        while ready:
            ready.popleft().switch(None)  # type: ignore[attr-defined]


_wakers: weakref.WeakKeyDictionary[object, _Waker] = weakref.WeakKeyDictionary()
_wakers_lock = threading.Lock()


def _waker_of(hub: object) -> _Waker:
    waker = _wakers.get(hub)
    if waker is None:
        with _wakers_lock:
            waker = _wakers.get(hub)
            if waker is None:
                waker = _wakers[hub] = _Waker(hub)
    return waker
