"""The inside of a spawned worker process, and how outcomes cross the pipe.

Kept apart from ``process_backend.py`` so a worker imports no more than it needs.
Everything here crosses between a parent and the children it spawned itself,
over a private pipe (and shared memory, for large arrays: see
``shared_memory.py``), so pickle is safe to use: nothing comes from a network.
"""

from __future__ import annotations

import os
import pickle
import signal
import sys
import time
import traceback
from _queue import Empty, SimpleQueue  # C's, which gevent never patches (it replaces queue.SimpleQueue)
from typing import Any, Callable, FrozenSet, List, Optional, Tuple

from ..errors import RemoteError, RemoteTraceback, SerializationError
from ..green import unpatched
from ..threads import block_process_signals
from .shared_memory import BlockPool, PeerBlocks, Wire, dump, load, plain, shared_wire
from .spawning import thread_locks_for_progress_bars

# Set in a worker process, so that a streamer made there (say, by importing the
# web app's module to reach the model) refuses to spawn workers of its own.
IN_WORKER_ENV = "STREAMER_CORE_WORKER"

_PARENT_POLL_SECONDS = 0.2

#: An item's outcome on the wire: (True, the result's wire) or (False, pickled error).
WireOutcome = Tuple[bool, Any]
#: What a traced batch carries: its cost, and each input's call as its
#: ``traceparent`` and arrival (ns since the epoch), or ``None`` (no span).
BatchTrace = Tuple[float, List[Optional[Tuple[str, int]]]]


def encode_exception(exc: BaseException) -> bytes:
    """Pickle an exception with its formatted traceback. One that cannot be
    re-created on the other side becomes a :class:`RemoteError` naming its type."""
    tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    try:
        payload = pickle.dumps((exc, tb), pickle.HIGHEST_PROTOCOL)
        pickle.loads(payload)  # some exceptions pickle but cannot be re-created
        return payload
    except Exception:
        return pickle.dumps((RemoteError(type(exc).__name__, str(exc)), tb), pickle.HIGHEST_PROTOCOL)


def decode_exception(payload: bytes) -> BaseException:
    exc: BaseException
    exc, tb = pickle.loads(payload)
    exc.__cause__ = RemoteTraceback(tb)
    return exc


def decode_outcome(ok: bool, payload: Any, peer: PeerBlocks) -> Tuple[bool, Any]:
    """An outcome from the worker; a result's arrays are copied out of the
    worker's shared memory, which it reuses once told."""
    try:
        return (True, load(payload, peer, copy=True)) if ok else (False, decode_exception(payload))
    except Exception as exc:
        return False, SerializationError(f"could not unpickle the worker's answer: {exc!r}")


def _encode_result(value: Any, pool: Optional[BlockPool], min_bytes: int) -> WireOutcome:
    if plain(value):
        return True, value  # pickled with the rest of the batch's outcomes
    try:
        payload, blocks = dump(value, pool, min_bytes)
        if not blocks:
            return True, payload
        # Lent to the parent until it names them free with a later batch.
        return True, shared_wire(payload, blocks)
    except Exception as exc:
        error = SerializationError(
            f"the model's result ({type(value).__name__}) cannot be sent back from the worker process: {exc}"
        )
        return False, encode_exception(error)


def watch_parent(parent_pid: int) -> None:
    """Exit as soon as the parent is gone, even in the middle of a model call:
    no orphaned worker keeps a GPU busy."""
    sleep = unpatched("time", "sleep")
    while True:
        sleep(_PARENT_POLL_SECONDS)
        if os.getppid() != parent_pid:
            os._exit(0)


#: A worker's exit status on SIGTERM, as a shell reports a process it ended.
_SIGTERM_EXIT = 128 + signal.SIGTERM
#: The longest the worker's main thread waits for a batch without waking
#: (seconds). Python runs a signal's handler in the main thread only, and the
#: kernel may hand SIGTERM to another thread (the pipe reader's, the model's
#: own): the main thread must come round to run it.
_WAKE_S = 0.5


def _exit_on_sigterm(signum: int, frame: Any) -> None:
    sys.exit(_SIGTERM_EXIT)


def _load_predict(spec: bytes, device: Optional[Any]) -> Any:
    from ..managed_model import load_predict

    target, args, kwargs = pickle.loads(spec)
    return load_predict(target, device, args, kwargs)


def worker_main(
    conn: Any,
    spec: bytes,
    device: Optional[Any],
    parent_pid: int,
    isolate_errors: bool,
    oom_errors: Any = None,
    shared_memory: Optional[Tuple[str, int]] = None,
    cpus: Optional[FrozenSet[int]] = None,
    trace_as: Optional[Tuple[str, str]] = None,
) -> None:
    """Body of a worker process: load the model, then run batches until told
    to stop or until the parent goes away. ``shared_memory`` is the prefix
    of this worker's block names and the least bytes a buffer of a result
    needs to go through shared memory (``None``: results go through the pipe).
    ``cpus``: the cores to run on, the parent's when its streamer was made
    (a web process pinned to one core since would hand that core down).
    ``trace_as``: the model's name and this worker's, when the streamer
    traces: each batch is run in its span (:mod:`streamer_core.telemetry.tracing`),
    exported by the tracer provider the model set up as it loaded."""
    if device is not None:
        os.environ["CUDA_VISIBLE_DEVICES"] = str(device)  # before anything can touch CUDA
    if cpus and hasattr(os, "sched_setaffinity") and os.sched_getaffinity(0) != cpus:
        try:
            os.sched_setaffinity(0, cpus)
        except OSError:
            pass  # a core taken away since (a container's cpuset changed): keep what was inherited
    os.environ[IN_WORKER_ENV] = "1"
    thread_locks_for_progress_bars()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    # SIGTERM (to the worker, or to a server's whole process group) ends it
    # through exit, so that what its model made is cleaned up (a named
    # semaphore, shared memory) rather than reported leaked by the resource tracker.
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    _start_thread(watch_parent, parent_pid)

    try:
        predict = _load_predict(spec, device)
    except BaseException as exc:
        if isinstance(exc, SystemExit) and exc.code == _SIGTERM_EXIT:
            raise  # told to stop while loading: not a model that cannot load
        from ..batching.oom import load_failure

        conn.send(("init_error", encode_exception(load_failure(exc, oom_errors, device))))
        return
    from ..managed_model import freeze_loaded, model_facts

    freeze_loaded()
    facts = model_facts(predict, device)
    tracing = None
    if trace_as is not None:
        from ..telemetry.tracing import BatchFacts

        tracing = BatchFacts(trace_as[0], "process", trace_as[1], facts.device)
    conn.send(("ready", os.getpid(), facts))

    # A reader thread takes batches off the pipe while the model runs, so the
    # parent can send the next batch ahead without blocking on a full pipe.
    pool = BlockPool(shared_memory[0], lock=unpatched("_thread", "allocate_lock")()) if shared_memory else None
    min_bytes = shared_memory[1] if shared_memory is not None else 0
    peer = PeerBlocks()
    inbox: SimpleQueue[Any] = SimpleQueue()
    _start_thread(_read_pipe, conn, inbox, pool)
    try:
        while True:
            try:
                message = inbox.get(timeout=_WAKE_S)
            except Empty:
                continue  # awake now and then: a SIGTERM that another thread took is handled here
            if message is None or message[0] == "stop":
                return  # told to stop, or the parent closed its end
            _, batch_id, wires, _, gone, trace = message
            peer.forget(gone)  # the parent's blocks it has unlinked
            traced = (tracing, trace) if tracing is not None and trace is not None else None
            outcomes, ran_out, seconds, splits = _run(
                predict, wires, isolate_errors, oom_errors, peer, pool, min_bytes, traced
            )
            dropped = pool.dropped() if pool is not None else []
            conn.send(("done", batch_id, outcomes, ran_out, seconds, dropped, splits))
            del outcomes
    finally:
        if pool is not None:
            pool.close()


def _start_thread(target: Callable[..., None], *args: Any) -> None:
    """Run ``target(*args)`` on an OS thread of its own that does not keep the
    process alive. A worker is spawned afresh, but it imports the parent's
    ``__main__`` again (so a model defined there can be found), and a
    ``monkey.patch_all()`` at the top of that script patches the worker too:
    its threads would be greenlets then, and the pipe reader, blocked in a
    read, would stop the model loop. The pipe reader, the parent watch and
    the queue between the reader and the loop are gevent's originals. The
    process's control signals are left to its main thread
    (:func:`~streamer_core.threads.block_process_signals`)."""

    def run() -> None:
        block_process_signals()
        target(*args)

    unpatched("_thread", "start_new_thread")(run, ())


def _read_pipe(conn: Any, inbox: SimpleQueue[Any], pool: Optional[BlockPool]) -> None:
    while True:
        try:
            message = conn.recv()
        except (EOFError, OSError):
            inbox.put(None)
            return
        if message[0] == "batch" and pool is not None:
            pool.give_names(message[3])  # results the parent has copied out: their blocks are free again
        inbox.put(message)
        if message[0] == "stop":
            return


def _run(
    predict: Any,
    payloads: List[Wire],
    isolate_errors: bool,
    oom_errors: Any,
    peer: PeerBlocks,
    pool: Optional[BlockPool],
    min_bytes: int,
    traced: Optional[Tuple[Any, BatchTrace]] = None,
) -> Tuple[List[Optional[WireOutcome]], Optional[List[Tuple[int, int]]], float, int]:
    """Unpickle a batch, run it, and pickle one outcome per input. Also
    returns, when the model ran out of memory, the spans of the batch (by
    position) whose model calls returned, for the parent to learn from (a
    span may take in an input that could not be unpickled between two that
    ran, which only makes the learned cap a little generous), the seconds
    the model ran, and how many times the batch or a part of it was split
    because it ran out of memory, for the parent's stats. ``traced``: the
    batch's facts and trace, when it is run in a span of its own."""
    from ..batching.runner import run_batch

    outcomes: List[Optional[WireOutcome]] = [None] * len(payloads)
    inputs, positions = [], []
    for position, payload in enumerate(payloads):
        try:
            inputs.append(load(payload, peer, copy=False))
            positions.append(position)
        except Exception as exc:
            error = SerializationError(f"could not unpickle this input in the worker process: {exc!r}")
            outcomes[position] = (False, encode_exception(error))
    if not inputs:
        return outcomes, None, 0.0, 0
    if traced is None:
        started = time.monotonic()
        run = run_batch(predict, inputs, isolate_errors, oom_errors)
        seconds = time.monotonic() - started
    else:
        from ..telemetry.tracing import from_traceparent, traced_run

        facts, (cost, sent) = traced
        calls = []
        for position in positions:
            call = sent[position]
            calls.append(None if call is None else from_traceparent(call[0], call[1]))
        run, seconds = traced_run(lambda: run_batch(predict, inputs, isolate_errors, oom_errors), facts, calls, cost)
    for position, (ok, value) in zip(positions, run.outcomes):
        outcomes[position] = _encode_result(value, pool, min_bytes) if ok else (False, encode_exception(value))
    if not run.out_of_memory:
        return outcomes, None, seconds, 0
    return outcomes, [(positions[start], positions[end - 1] + 1) for start, end in run.ran], seconds, run.oom_splits
