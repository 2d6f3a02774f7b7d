"""The future of one ``submit(batch)`` call: :class:`BatchFuture`.

A :class:`concurrent.futures.Future`, so ``wait``, ``as_completed`` and
``asyncio.wrap_future`` work with it, made cheaper for the one thing almost
every call does: complete once, wake one waiting caller. The scheduler
(:mod:`streamer_core.batching.scheduler`) completes it with :func:`settle` or, for a
batch's results, quietly first and then wakes the callers together.
"""

from __future__ import annotations

import concurrent.futures
import os
import threading
import time
from typing import Any, Callable, List, Optional

from .errors import OverloadedError, StreamerTimeoutError
from .green import green_waiter, in_greenlet, unpatched, wait_green
from .telemetry.stats import Level, ModelStats

__all__ = ["BatchFuture", "settle"]

# Slack on top of a call's deadline before ``BatchFuture.result()`` gives up on
# its own; the dispatcher normally fails an overdue call right at the deadline.
_RESULT_GRACE = 1.0


# What Future.__init__ would make, made by BatchFuture on first use instead;
# under this lock, so that a completion and a first use do not interleave.
_LAZY_PARTS = frozenset(("_condition", "_waiters", "_done_callbacks"))
_LAZY_LOCK = threading.Lock()
_CANCELLED_STATES = frozenset(("CANCELLED", "CANCELLED_AND_NOTIFIED"))
_DONE_STATES = _CANCELLED_STATES | {"FINISHED"}


def _new_lock_after_fork() -> None:
    # Held by a thread of the parent at the fork (completing a call), it would stay held here.
    global _LAZY_LOCK
    _LAZY_LOCK = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_new_lock_after_fork)


# The OS's lock, as threading had it before any gevent monkey-patching:
# what a caller blocks on when it is an OS thread (a greenlet waits on the
# hub: .green), released by the model's thread. gevent's lock, a Python
# object, cost a request more to make and take than the rest of its future.
_allocate_lock: Optional[Callable[[], Any]] = None


def _os_lock_maker() -> Callable[[], Any]:
    global _allocate_lock
    _allocate_lock = unpatched("_thread", "allocate_lock")
    return _allocate_lock


class BatchFuture(concurrent.futures.Future[List[Any]]):
    """The future of one ``submit(batch)`` call; its result is a list, one
    output per input, in input order.

    It is a :class:`concurrent.futures.Future`, so ``wait``, ``as_completed``
    and ``asyncio.wrap_future`` work with it. Two differences: ``result()``
    without a timeout still returns by the call's deadline, and when
    ``result(timeout)`` runs out the call is given up, so its items are dropped
    before they reach the model, and :class:`StreamerTimeoutError` is raised.

    A waiting caller blocks on one lock that completion releases, rather than
    on the Future's condition: the condition is still held by the completing
    thread when it notifies, so the woken caller would block again at once.
    That second wake-up per call is what limits a thread-per-request server.
    And that condition, with the lists of waiters and callbacks, is made
    only when something needs it (``wait``, ``as_completed``, a callback, a
    cancel): most calls complete without ever making one.
    """

    #: Which input of the call failed it (its index in the list given),
    #: where the call failed for one input (the model raised for it, it
    #: could not be decoded in a worker); ``None`` otherwise.
    failed_input: Optional[int] = None
    _deadline: float = float("inf")
    #: The call's timeout (seconds), as its deadline was set from it.
    _timeout_s: float = float("inf")
    #: Where the call's outcome is counted (set by the scheduler).
    _stats: Optional[ModelStats | Level] = None
    #: Wakes the greenlet waiting in :meth:`result` (:mod:`.green`), and
    #: that greenlet: its later waits replace the wake, others' add callbacks.
    _green_wake: Optional[Callable[[], None]] = None
    _green_owner: object = None
    #: Called once the call ends other than by its results (an error, a
    #: timeout, a cancel); maybe more than once, so it must be idempotent.
    #: A backend's cheaper done-callback: adding a real one makes the
    #: future's condition, and takes its slow path, on every call.
    _unanswered: Optional[Callable[[], None]] = None
    #: Why the call ended unanswered, once it has (one of
    #: ``stats.DROP_REASONS``): what its inputs still queued are dropped for.
    _why: str = "cancelled"

    def __init__(self) -> None:
        # Not Future.__init__: its condition and lists are made on first use
        # (__getattr__), which most calls never reach: a completion that
        # finds no condition sets the result under _LAZY_LOCK alone.
        self._state = "PENDING"
        self._result = None
        self._exception = None
        self._finished = (_allocate_lock or _os_lock_maker())()
        self._finished.acquire()

    def __getattr__(self, name: str) -> Any:
        if name not in _LAZY_PARTS:
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        parts = self.__dict__
        with _LAZY_LOCK:
            if "_condition" not in parts:
                parts["_waiters"], parts["_done_callbacks"] = [], []
                parts["_condition"] = threading.Condition()
        return parts[name]

    def done(self) -> bool:
        return self._state in _DONE_STATES

    def cancelled(self) -> bool:
        return self._state in _CANCELLED_STATES

    def running(self) -> bool:
        return self._state == "RUNNING"

    def set_result(self, result: Any) -> None:
        super().set_result(result)
        self._wake()

    def set_exception(self, exception: Optional[BaseException]) -> None:
        if isinstance(exception, (StreamerTimeoutError, OverloadedError)):
            self._why = "expired"  # its deadline, or under overload the longest it may wait, passed
        super().set_exception(exception)
        stats = self._stats
        if stats is not None and exception is not None:
            stats.failed(exception)  # counted before the caller wakes to read the numbers
        self._ended_unanswered()
        self._wake()

    def _ended_unanswered(self) -> None:
        hook = self._unanswered
        if hook is not None:
            hook()

    def _set_quietly(self, result: Any) -> bool:
        """Complete the future but leave its waiter asleep until
        :meth:`_wake`: a batch's results are all set before any caller wakes
        to compete with the delivering thread."""
        with _LAZY_LOCK:
            if "_condition" not in self.__dict__:  # nobody waits on it, nor has a callback: no notifying
                if self._state != "PENDING":
                    return False
                self._result, self._state = result, "FINISHED"
                return True
        try:
            super().set_result(result)
        except concurrent.futures.InvalidStateError:
            return False
        return True

    def _wake(self) -> None:
        """Let the waiting caller (a thread, or a greenlet) return."""
        self._finished.release()
        green_wake = self._green_wake
        if green_wake is not None:
            green_wake()

    def cancel(self) -> bool:
        return self._cancel("cancelled")

    def disconnected(self) -> bool:
        """Give the call up because its HTTP client went away (the web layers
        call it when the server tells them): as :meth:`cancel`, its inputs
        still queued are dropped, counted as ``disconnected``."""
        return self._cancel("cancelled", "disconnected")

    def _cancel(self, outcome: str, why: Optional[str] = None) -> bool:
        with self._condition:
            if self._state not in ("PENDING", "RUNNING"):
                return self._state in _CANCELLED_STATES
            # Before the state changes: the dispatcher reads it once the call is not pending.
            self._why = why or ("expired" if outcome == "timeout" else "cancelled")
            cancelled = super().cancel()
        if cancelled:
            # As an executor does for a cancelled item: concurrent.futures.wait()
            # and as_completed() count only a "notified" cancel as done.
            self.set_running_or_notify_cancel()
            stats = self._stats
            if stats is not None:
                stats.finished(outcome)
            self._ended_unanswered()
            self._wake()
        return cancelled

    def _wait_green(self, timeout: float) -> bool:
        """Yield to the gevent hub until done or ``timeout`` seconds pass;
        return whether done. :meth:`_wake` wakes the greenlet directly, in
        its later waits too (a view looking at its client between waits); a
        second greenlet waiting on the same call goes by a done-callback."""
        wake, waiter, current = green_waiter()
        if self._green_wake is None or self._green_owner is current:
            # A wake that read the one replaced found the call done, as the
            # look below does.
            self._green_wake, self._green_owner = wake, current
        else:
            self.add_done_callback(lambda _done: wake())
        # Completed before the hook was in place: _wake did not see it.
        if not self.done():
            wait_green(waiter, timeout)
        return self.done()

    def result(self, timeout: Optional[float] = None) -> List[Any]:
        self._wait(timeout)
        result = self._result
        if self._state == "FINISHED" and self._exception is None and result is not None:
            return result  # the common case, without the condition's lock
        return super().result(0)

    def exception(self, timeout: Optional[float] = None) -> Optional[BaseException]:
        self._wait(timeout)
        return super().exception(0)

    def _wait_done(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for the call to end, without giving
        it up when the time runs out (as :meth:`result` does); return
        whether it has ended."""
        if self._state in _DONE_STATES:
            return True
        if in_greenlet():
            return self._wait_green(timeout)
        if self._finished.acquire(timeout=timeout):
            self._finished.release()  # let any other waiter through too
            return True
        return self.done()

    def _wait(self, timeout: Optional[float]) -> None:
        if self._state in _DONE_STATES:
            return
        # Never longer than the call may take (the dispatcher fails it at its
        # deadline), which also keeps a huge timeout from overflowing the wait.
        longest = max(0.0, self._deadline - time.monotonic()) + _RESULT_GRACE
        timeout = longest if timeout is None else min(timeout, longest)
        if in_greenlet():  # yield to the gevent hub (streamer_core.green)
            if self._wait_green(max(0.0, timeout)):
                return
        elif self._finished.acquire(timeout=max(0.0, timeout)):
            self._finished.release()  # let any other waiter through too
            return
        if self._cancel("timeout"):
            if time.monotonic() >= self._deadline:  # its deadline ended it, however long this last wait
                raise StreamerTimeoutError(f"the call did not finish within its timeout of {self._timeout_s:.3g}s")
            raise StreamerTimeoutError(f"no result within {timeout:.3g}s; the call was given up")
        # It finished just as we gave up: its result (or error) stands.


def settle(future: concurrent.futures.Future[Any], exc: Optional[BaseException] = None, result: Any = None) -> bool:
    """Complete ``future`` unless it is done already (cancelled, timed out);
    return whether this call completed it."""
    try:
        if exc is not None:
            future.set_exception(exc)
        else:
            future.set_result(result)
    except concurrent.futures.InvalidStateError:
        return False
    return True
