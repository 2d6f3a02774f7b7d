"""Signals reach the process's main thread: the streamer's own threads
block the signals servers and terminals send (so the kernel hands them to
a thread that runs their handlers), and
:func:`~streamer_core.web.settling.wake_main_thread_on_signals` wakes a main
thread asleep in a lock wait when a signal lands on a thread the program
did not make (granian's runtime threads). Each case runs in a fresh
interpreter: signal handlers and masks are the process's."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.skipif(not hasattr(signal, "pthread_kill"), reason="POSIX threads' signals")

# The main thread waits with no timeout for the event its SIGTERM handler
# sets, as granian's WSGI worker does; a thread the program did not make
# with streamer_core (signals unblocked) takes the SIGTERM.
LOST_SIGNAL = """
import signal, sys, threading, time
from streamer_core.web.settling import wake_main_thread_on_signals
stop = threading.Event()
signal.signal(signal.SIGTERM, lambda signum, frame: stop.set())
if sys.argv[1] == "relay":
    assert wake_main_thread_on_signals()
foreign = threading.Thread(target=time.sleep, args=(60,), daemon=True)
foreign.start()
def deliver():
    time.sleep(0.3)
    signal.pthread_kill(foreign.ident, signal.SIGTERM)  # as the kernel may choose
threading.Thread(target=deliver, daemon=True).start()
stop.wait()
print("stopped", flush=True)
"""


def run(script: str, *args: str, timeout: float) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script), *args],
        env=env, capture_output=True, text=True, timeout=timeout,
    )  # fmt: skip


def test_a_signal_taken_by_another_thread_wakes_the_main_thread_with_the_relay():
    done = run(LOST_SIGNAL, "relay", timeout=30)
    assert done.returncode == 0 and done.stdout.strip() == "stopped", done.stderr[-2000:]


def test_control_without_the_relay_the_main_thread_sleeps_on():
    """What the relay is for: the same program without it never wakes."""
    with pytest.raises(subprocess.TimeoutExpired):
        run(LOST_SIGNAL, "plain", timeout=3)


def test_the_relay_is_not_set_off_the_main_thread_nor_over_a_wakeup_fd_in_use():
    script = """
    import os, signal, threading
    from streamer_core.web.settling import wake_main_thread_on_signals
    got = []
    thread = threading.Thread(target=lambda: got.append(wake_main_thread_on_signals()))
    thread.start(); thread.join()
    r, w = os.pipe(); os.set_blocking(w, False)
    signal.set_wakeup_fd(w)
    print(got[0], wake_main_thread_on_signals(), signal.set_wakeup_fd(-1) == w)
    """
    done = run(script, timeout=30)
    assert done.stdout.split() == ["False", "False", "True"], done.stderr[-2000:]


def test_the_streamers_threads_leave_the_process_signals_to_the_main_thread():
    """A thread-backend streamer's model and dispatch threads, and the
    threads torch starts from the model's, block SIGTERM, SIGINT and the
    rest of PROCESS_SIGNALS; the main thread blocks none of them."""
    script = """
    import re, threading
    from streamer_core import ThreadedStreamer
    from streamer_core.threads import PROCESS_SIGNALS

    def blocked(tid):
        with open(f"/proc/self/task/{tid}/status") as status:
            mask = int(re.search(r"SigBlk:\\s*([0-9a-f]+)", status.read()).group(1), 16)
        return {int(s) for s in PROCESS_SIGNALS if mask >> (int(s) - 1) & 1}

    def model(batch):
        return [threading.get_native_id() for _ in batch]

    streamer = ThreadedStreamer(model, batch_size=4, max_latency=0.01)
    model_tid = streamer.predict([1])[0]
    names = {t.native_id: t.name for t in threading.enumerate()}
    ours = [tid for tid, name in names.items() if name.startswith("streamer-")]
    wanted = {int(s) for s in PROCESS_SIGNALS}
    print(blocked(model_tid) == wanted, all(blocked(tid) == wanted for tid in ours), len(ours) >= 2,
          blocked(threading.main_thread().native_id) == set())
    streamer.close()
    """
    if not os.path.exists("/proc/self/task"):
        pytest.skip("reads Linux's /proc")
    done = run(script, timeout=60)
    assert done.stdout.split() == ["True", "True", "True", "True"], (done.stdout, done.stderr[-2000:])


def test_under_gevents_monkey_patching_the_main_thread_keeps_its_signals():
    """Patched, the streamer's threads are greenlets on the main OS thread:
    blocking signals there would keep a gevent server from its own SIGTERM."""
    script = """
    from gevent import monkey
    monkey.patch_all()
    import re
    from streamer_core import ThreadedStreamer

    streamer = ThreadedStreamer(lambda batch: batch, batch_size=4, max_latency=0.01)
    assert streamer.predict([1]) == [1]
    with open("/proc/self/task/%d/status" % __import__("os").getpid()) as status:
        print(int(re.search(r"SigBlk:\\s*([0-9a-f]+)", status.read()).group(1), 16))
    streamer.close()
    """
    if not os.path.exists("/proc/self/task"):
        pytest.skip("reads Linux's /proc")
    done = run(script, timeout=60)
    assert done.stdout.split() == ["0"], (done.stdout, done.stderr[-2000:])


@pytest.mark.parametrize("imported", ["before", "after"])
def test_a_forked_childs_main_thread_keeps_its_signals(imported):
    """After a fork (a gunicorn worker) the child's main thread is the one
    that forked, though ``threading.main_thread().native_id`` still names the
    parent's: it must not block its own signals as if it were another
    thread (the worker then never quit on Ctrl-C, nor on SIGTERM). The
    library imported before the fork (a config's hooks import it in the
    master) or only after it (the app loaded in the worker: the library's
    fork hook never ran)."""
    script = f"""
    import os, re, threading

    def blocked():
        with open("/proc/self/task/%d/status" % os.getpid()) as status:
            return int(re.search(r"SigBlk:\\s*([0-9a-f]+)", status.read()).group(1), 16)

    if {imported == "before"}:
        from streamer_core.threads import block_process_signals
    threading.main_thread().native_id  # as gunicorn's master leaves it
    child = os.fork()
    if child == 0:
        from streamer_core.threads import block_process_signals

        block_process_signals()  # in the child's main thread
        os._exit(0 if blocked() == 0 else 1)
    _, status = os.waitpid(child, 0)
    print(os.waitstatus_to_exitcode(status))
    """
    if not os.path.exists("/proc/self/task"):
        pytest.skip("reads Linux's /proc")
    done = run(script, timeout=60)
    assert done.stdout.split() == ["0"], (done.stdout, done.stderr[-2000:])


def test_the_signals_left_to_the_main_thread_are_those_servers_and_terminals_send():
    from streamer_core.threads import PROCESS_SIGNALS

    expected = {"SIGINT", "SIGTERM", "SIGQUIT", "SIGHUP", "SIGUSR1", "SIGUSR2", "SIGWINCH", "SIGTTIN", "SIGTTOU",
                "SIGCHLD", "SIGALRM"}  # fmt: skip
    assert {signal.Signals(s).name for s in PROCESS_SIGNALS} == {n for n in expected if hasattr(signal, n)}


def test_a_spawned_workers_own_threads_leave_the_signals_to_its_main_thread(tmp_path):
    """The process backend's worker reads its pipe on a thread of its own:
    that thread blocks the control signals, the worker's main thread none."""
    script = """
    import os, re
    from streamer_core import Streamer
    from streamer_core.threads import PROCESS_SIGNALS

    def masks(batch):
        out = {}
        for tid in os.listdir("/proc/self/task"):
            with open(f"/proc/self/task/{tid}/status") as status:
                out[int(tid)] = int(re.search(r"SigBlk:\\s*([0-9a-f]+)", status.read()).group(1), 16)
        return [(os.getpid(), out)] * len(batch)

    if __name__ == "__main__":
        streamer = Streamer(masks, batch_size=1, max_latency=0.01, worker_num=1)
        pid, found = streamer.predict([1])[0]
        wanted = sum(1 << (int(s) - 1) for s in PROCESS_SIGNALS)
        others = [mask for tid, mask in found.items() if tid != pid]
        print(found[pid] == 0, len(others) >= 1, any(mask & wanted == wanted for mask in others))
        streamer.close()
    """
    if not os.path.exists("/proc/self/task"):
        pytest.skip("reads Linux's /proc")
    path = tmp_path / "masks_in_a_worker.py"  # a script: the spawned worker imports its model from it
    path.write_text(textwrap.dedent(script))
    done = subprocess.run(
        [sys.executable, str(path)], env=dict(os.environ, PYTHONPATH=str(ROOT)), capture_output=True,
        text=True, timeout=120,
    )  # fmt: skip
    assert done.stdout.split() == ["True", "True", "True"], (done.stdout, done.stderr[-2000:])


def test_after_a_signal_the_relay_rests():
    """One poke per signal: the relay does not wake itself with its own
    poke, over and over (a core burnt for good)."""
    script = """
    import os, signal, time
    from streamer_core.web.settling import wake_main_thread_on_signals
    signal.signal(signal.SIGUSR1, lambda signum, frame: None)
    assert wake_main_thread_on_signals()
    os.kill(os.getpid(), signal.SIGUSR1)
    time.sleep(0.3)
    start = time.process_time()
    time.sleep(1.0)
    print(time.process_time() - start < 0.1)
    """
    done = run(script, timeout=30)
    assert done.stdout.split() == ["True"], (done.stdout, done.stderr[-2000:])
