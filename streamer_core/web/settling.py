"""What a web process does once its models are loaded, under any server:
:func:`freeze_after_loading`; and, under a server whose worker sleeps in a
lock wait until a signal's handler wakes it (granian),
:func:`wake_main_thread_on_signals`.

gunicorn's ``post_worker_init`` freezes through
:func:`streamer_core.web.gunicorn.settle`; a server without such a hook
(granian, uWSGI) runs them from the WSGI module that loads the models, after
:func:`flask_streamer.start_streamers`::

    app = create_app()
    start_streamers(app)
    freeze_after_loading()
    wake_main_thread_on_signals()
"""

from __future__ import annotations

import gc
import os
import signal
import threading
from typing import Any

from ..threads import background

__all__ = ["GC_THRESHOLD", "POKE_SIGNAL", "freeze_after_loading", "wake_main_thread_on_signals"]

#: The collector's thresholds in a settled web process: its first
#: generation collected once per thousand requests or so, not every 70.
GC_THRESHOLD = (10_000, 10, 10)


def freeze_after_loading() -> None:
    """Keep what loading made (the model, torch's and the framework's
    modules: some 450,000 objects, never garbage) out of the garbage
    collector's sight, and collect the first generation less often: a full
    collection then takes milliseconds, not the hundreds that stall every
    request waiting in this process (the docs' Performance page), and the
    interpreter's last collections as the process exits do not walk it all
    (most of an idle process's stop). Call it once the process has loaded
    its models and before it serves."""
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLD)


#: The signal that wakes the main thread (a real-time one, which no server
#: or terminal sends): its handler does nothing, but its delivery interrupts
#: the main thread's wait, so Python runs every handler pending there.
POKE_SIGNAL = getattr(signal, "SIGRTMIN", 34) + 3


def wake_main_thread_on_signals() -> bool:
    """Make sure a signal's Python handler runs even when the signal lands
    on another thread than the main one, asleep in a lock wait: call it from
    the main thread, in a process whose server waits so for its stop.

    Python runs handlers in the main thread only, when it next runs Python
    code; a signal the kernel hands to another thread (under granian, one
    of its Rust runtime's) does not wake it. granian's WSGI worker waits
    without a timeout for the event its SIGTERM handler sets: it stopped
    serving on SIGTERM and never exited, one shutdown in three to six under
    load (the Flask example, 64 blocking threads). Here Python's wakeup fd
    (``signal.set_wakeup_fd``, which every signal with a Python handler
    writes its number to, from whatever thread took it) is read by a thread
    of ours, which interrupts the main thread with :data:`POKE_SIGNAL`.

    Returns whether it is in place: not where the platform lacks
    ``pthread_kill`` or real-time signals, off the main thread, or where a
    wakeup fd is set already (an asyncio loop's, which handles signals
    itself)."""
    if not hasattr(signal, "pthread_kill") or not hasattr(signal, "SIGRTMIN"):
        return False
    if threading.current_thread() is not threading.main_thread():
        return False
    read_end, write_end = os.pipe()
    os.set_blocking(write_end, False)
    theirs = signal.set_wakeup_fd(write_end, warn_on_full_buffer=False)
    if theirs != -1:  # someone else's (an asyncio loop's): theirs again
        signal.set_wakeup_fd(theirs)
        os.close(read_end)
        os.close(write_end)
        return False
    signal.signal(POKE_SIGNAL, _ignore)
    main = threading.main_thread().ident
    assert main is not None

    def relay() -> None:
        while True:
            numbers = os.read(read_end, 64)
            if not numbers:
                return
            if any(number != POKE_SIGNAL for number in numbers):
                signal.pthread_kill(main, POKE_SIGNAL)

    background(relay, "streamer-signal-relay").start()
    return True


def _ignore(signum: int, frame: Any) -> None:
    """The poke's handler: the wake-up is the point."""
