"""Large arrays between a web process and its spawned workers, through shared memory.

Pickle's protocol 5 hands the raw bytes of a numpy array to a callback instead
of writing them into the pickle. Each such buffer of at least ``min_bytes``
is copied once into a block of POSIX shared memory, and only the small pickle
and the blocks' names cross the pipe; the other side maps the blocks (once
each: blocks are reused) and rebuilds the arrays on them. CPU torch tensors
travel as the arrays that share their memory, and come back as tensors.

How an input and its result move::

    web process                                 worker process
    -----------                                 --------------
    caller thread: pack(input)
      copy each large buffer into a block ----> unpack: arrays are views of the
      of this process's pool (the one copy)     blocks (no copy); the model runs
    collector thread: unpack(result)   <------  pack(result): large buffers into
      copy out of the worker's blocks           blocks of the worker's pool (the
      (the one copy); names them free           one copy), lent until the web
      with the worker's next batch              process says they are free

Who frees what, so that nothing is left in ``/dev/shm``:

- Each process unlinks only the blocks it created, and keeps the ones it may
  reuse (up to ``idle_bytes``); the peer is told which names are gone, so it
  unmaps them too.
- An input's blocks return to the web process's pool when the input is
  dropped: its call answered, failed, timed out or given up, and no worker
  holding it (a batch keeps its inputs until the worker answers or dies).
- A worker's blocks are named with a prefix the web process chose, so when
  the worker dies the web process unlinks whatever it left behind.
- Every block is reserved whole when it is made (``posix_fallocate``): when
  ``/dev/shm`` is full (64 MB is Docker's default) the value crosses the pipe
  as it would without shared memory, with one warning, never a ``SIGBUS``.

Everything here crosses between a parent and the children it spawned, so
pickle is as safe as it is on the pipe.
"""

from __future__ import annotations

import itertools
import logging
import math
import os
import pickle
import sys
import threading
from collections import deque
from multiprocessing.shared_memory import SharedMemory
from typing import Any, Deque, Dict, Iterable, List, Optional, Sequence, Tuple, Union

from ..codec import pickle_out_of_band
from ..errors import SerializationError

try:
    import _posixshmem  # type: ignore[import-not-found]  # what multiprocessing.shared_memory uses
except ImportError:  # pragma: no cover - Windows
    _posixshmem = None

__all__ = ["available", "BlockPool", "PeerBlocks", "SharedValue", "dump", "encode_input", "load", "wire_of"]

logger = logging.getLogger("streamer_core")

#: Free blocks a process keeps for reuse, in bytes; beyond this they are unlinked.
DEFAULT_IDLE_BYTES = 256 * 1024 * 1024

_SHM_DIR = "/dev/shm"
_PAGE = 4096

#: What crosses the pipe for one value: its pickle alone, or
#: ``("shm", pickle, ((block name, byte count), ...))``, or a str, int,
#: float, bool or None as it is (see :func:`plain`).
Wire = Union[bytes, Tuple[str, bytes, Tuple[Tuple[str, int], ...]], str, int, float, bool, None]

#: Types whose values need no pickle of their own: they cannot fail to pickle,
#: and the pipe pickles a batch's list of them in one call.
_PLAIN = frozenset([str, int, float, bool, type(None)])


def plain(value: Any) -> bool:
    """Whether ``value`` crosses as it is (exactly a str, int, float, bool
    or None: not bytes, which would read as a pickle)."""
    return type(value) in _PLAIN


def available() -> bool:
    """Whether this platform has POSIX shared memory (not Windows)."""
    return _posixshmem is not None


def block_size(nbytes: int) -> int:
    """The size of block that holds ``nbytes``: rounded up to an eighth of the
    next power of two (so a block is reused for values of about the same
    size, and at most an eighth of it is wasted), and to whole pages."""
    step = max(_PAGE, 1 << max(0, (nbytes - 1).bit_length() - 3))
    return -(-nbytes // step) * step


def new_prefix(tag: str) -> str:
    """A block-name prefix unique to this process: ``sc`` + a random token."""
    return f"sc{os.urandom(4).hex()}{tag}_"


class BlockPool:
    """The shared memory blocks this process created, reused by size.

    ``take`` and ``close`` run under a lock; ``give`` does not lock (it only
    appends to a deque), so a finalizer may call it from any thread, even one
    inside ``take``. ``lock`` replaces the default ``threading.Lock()``: an
    OS lock where gevent has patched ``threading`` and real threads share
    the pool."""

    def __init__(self, prefix: str, idle_bytes: int = DEFAULT_IDLE_BYTES, lock: Optional[Any] = None) -> None:
        self.prefix = prefix
        self._idle_limit = idle_bytes
        self._names = itertools.count()
        self._lock = threading.Lock() if lock is None else lock
        self._blocks: Dict[str, SharedMemory] = {}  # every block not unlinked yet
        self._idle: Dict[int, List[SharedMemory]] = {}  # by size
        self._idle_bytes = 0
        self._returned: Deque[SharedMemory] = deque()
        self._dropped: List[str] = []  # unlinked since the peer was last told
        self._closed = False
        self._warned = False

    def take(self, nbytes: int) -> Optional[SharedMemory]:
        """A block of at least ``nbytes``, or ``None`` when none can be made
        (``/dev/shm`` full, or the pool closed)."""
        size = block_size(nbytes)
        with self._lock:
            if self._closed:
                return None
            self._settle()
            free = self._idle.get(size)
            if free:
                self._idle_bytes -= size
                return free.pop()
            # The pid keeps apart two processes forked from one that made the pool.
            name = f"{self.prefix}{os.getpid():x}_{next(self._names):x}"
        try:
            block = _create(name, size)
        except OSError as exc:
            if not self._warned:
                self._warned = True
                logger.warning(
                    "shared memory is full (%s): large arrays cross to the workers through the pipe, more slowly; "
                    "give /dev/shm more room (docker run --shm-size=1g, or a Kubernetes emptyDir with "
                    "medium: Memory)",
                    exc,
                )
            return None
        with self._lock:
            if not self._closed:
                self._blocks[name] = block
                return block
        _destroy(block)
        return None

    def give(self, block: SharedMemory) -> None:
        """Take ``block`` back for reuse; from any thread."""
        if self._closed:
            _close(block)  # unlinked by close()
        else:
            self._returned.append(block)

    def give_names(self, names: Iterable[str]) -> None:
        """Take back the blocks named (lent to a peer, which is done with them)."""
        for name in names:
            block = self._blocks.get(name)
            if block is not None:
                self._returned.append(block)

    def dropped(self) -> List[str]:
        """The names unlinked since the last call, for the peer to unmap."""
        with self._lock:
            self._settle()
            names, self._dropped = self._dropped, []
            return names

    def _settle(self) -> None:
        # Under the lock: file the blocks given back as idle, or unlink them.
        while self._returned:
            block = self._returned.popleft()
            if self._blocks.get(block.name) is not block:
                continue  # unlinked already
            if self._idle_bytes + block.size > self._idle_limit:
                del self._blocks[block.name]
                self._dropped.append(block.name)
                _destroy(block)
            else:
                self._idle.setdefault(block.size, []).append(block)
                self._idle_bytes += block.size

    def close(self) -> None:
        """Unlink every block, lent or idle. Safe to call twice."""
        with self._lock:
            self._closed = True
            blocks = list(self._blocks.values())
            self._blocks.clear()
            self._idle.clear()
            self._returned.clear()
        for block in blocks:
            _destroy(block)


def _create(name: str, size: int) -> SharedMemory:
    # Made here rather than by SharedMemory(create=True), which, when the
    # size cannot be had, unregisters a name it never registered with the
    # resource tracker (a traceback on stderr).
    fd = _posixshmem.shm_open("/" + name, os.O_CREAT | os.O_EXCL | os.O_RDWR, mode=0o600)
    try:
        os.ftruncate(fd, size)
        if hasattr(os, "posix_fallocate"):
            # Reserve the pages now: on a full tmpfs this fails here, where a
            # write into an unreserved page would kill the process (SIGBUS).
            os.posix_fallocate(fd, 0, size)
    except OSError:
        _posixshmem.shm_unlink("/" + name)
        raise
    finally:
        os.close(fd)
    return SharedMemory(name=name)  # maps it, and registers it with the resource tracker


def _destroy(block: SharedMemory) -> None:
    try:
        block.unlink()
    except OSError:
        pass
    _close(block)


def _buffer(block: SharedMemory) -> memoryview:
    buffer = block.buf
    assert buffer is not None, "a closed block"
    return buffer


def _close(block: SharedMemory) -> bool:
    """Unmap ``block``; ``False`` while arrays built on it are still alive."""
    try:
        block.close()
        return True
    except BufferError:
        return False
    except OSError:
        return True


def unlink_leftovers(prefix: str) -> int:
    """Unlink every block whose name starts with ``prefix`` (those of a worker
    that died): returns how many. Only where blocks are files (Linux)."""
    try:
        names = [name for name in os.listdir(_SHM_DIR) if name.startswith(prefix)]
    except OSError:
        return 0
    for name in names:
        try:
            SharedMemory(name=name).unlink()  # registered and unregistered with the shared tracker
        except (OSError, ValueError):
            pass
    return len(names)


class PeerBlocks:
    """Blocks another process created, each mapped here once and kept until
    that process says it is gone."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._mapped: Dict[str, SharedMemory] = {}
        self._stale: List[SharedMemory] = []  # forgotten, still viewed by live arrays

    def view(self, name: str, nbytes: int) -> memoryview:
        block = self._mapped.get(name)
        if block is None:
            block = SharedMemory(name=name)
            with self._lock:
                self._mapped[name] = block
        if nbytes > block.size:
            raise ValueError(f"shared memory block {name} holds {block.size} bytes, not {nbytes}")
        return _buffer(block)[:nbytes]

    def forget(self, names: Iterable[str]) -> None:
        with self._lock:
            blocks = [block for block in (self._mapped.pop(name, None) for name in names) if block is not None]
            blocks.extend(self._stale)
            self._stale = [block for block in blocks if not _close(block)]

    def forget_prefix(self, prefix: str) -> None:
        self.forget([name for name in list(self._mapped) if name.startswith(prefix)])

    def close(self) -> None:
        self.forget(list(self._mapped))


class SharedValue:
    """An input whose large buffers are in blocks of ``pool``: what is queued
    in the web process. Its blocks go back to the pool when it is dropped."""

    __slots__ = ("payload", "blocks", "pool")

    def __init__(self, payload: bytes, blocks: List[Tuple[SharedMemory, int]], pool: BlockPool) -> None:
        self.payload = payload
        self.blocks = blocks
        self.pool = pool

    @property
    def wire(self) -> Wire:
        return shared_wire(self.payload, self.blocks)

    def __del__(self) -> None:
        for block, _ in self.blocks:
            self.pool.give(block)


def shared_wire(payload: bytes, blocks: Sequence[Tuple[SharedMemory, int]]) -> Wire:
    """The wire of a pickle whose large buffers :func:`dump` put in ``blocks``."""
    return ("shm", payload, tuple((block.name, nbytes) for block, nbytes in blocks))


def wire_of(value: Any) -> Wire:
    """What crosses the pipe for a queued value: a :class:`SharedValue`'s
    wire, anything else (a pickle, a plain value) as it is."""
    return value.wire if isinstance(value, SharedValue) else value


def _tensor_from_array(array: Any) -> Any:
    import torch

    return torch.from_numpy(array)


class _TensorPickler(pickle.Pickler):
    """Pickles a dense CPU torch tensor as the numpy array sharing its memory,
    so that its bytes leave the pickle as arrays' do."""

    def reducer_override(self, obj: Any) -> Any:
        torch = sys.modules.get("torch")
        if torch is not None and type(obj) is torch.Tensor and obj.device.type == "cpu" and not obj.requires_grad:
            try:
                return _tensor_from_array, (obj.numpy(),)
            except (TypeError, RuntimeError):  # bfloat16 and other types numpy lacks
                pass
        return NotImplemented


def dump(value: Any, pool: Optional[BlockPool], min_bytes: int) -> Tuple[bytes, List[Tuple[SharedMemory, int]]]:
    """Pickle ``value``, its buffers of at least ``min_bytes`` copied into
    blocks of ``pool``: the pickle and ``[(block, byte count), ...]``. Raises
    what pickling raises. Without a pool, or when it has no room, every
    buffer stays in the pickle."""
    pickler = _TensorPickler if "torch" in sys.modules else pickle.Pickler
    payload, large = pickle_out_of_band(value, max(min_bytes, 1) if pool is not None else math.inf, pickler)
    if not large:
        return payload, []
    assert pool is not None
    blocks: List[Tuple[SharedMemory, int]] = []
    for view in large:
        block = pool.take(view.nbytes)
        if block is None:
            for taken, _ in blocks:
                pool.give(taken)
            return pickle_out_of_band(value, math.inf, pickler)[0], []
        _buffer(block)[: view.nbytes] = view  # the one copy on this side
        blocks.append((block, view.nbytes))
    return payload, blocks


def encode_input(value: Any, index: int, pool: Optional[BlockPool], min_bytes: int) -> Any:
    """Input ``index`` of a call as it is queued for a worker process: a
    plain value as it is (pickled with the rest of its batch when sent),
    anything else pickled, its large buffers in shared memory. Raises
    :class:`SerializationError` for an input that cannot be pickled."""
    if plain(value):
        return value
    try:
        payload, blocks = dump(value, pool, min_bytes)
    except Exception as exc:
        raise SerializationError(
            f"input {index} ({type(value).__name__}) cannot be sent to a worker process because it cannot be "
            f"pickled: {exc}. Pass plain data (str, numbers, lists, dicts, numpy arrays, tensors), "
            "or use ThreadedStreamer, which does not copy inputs"
        ) from exc
    if not blocks:
        return payload
    assert pool is not None
    return SharedValue(payload, blocks, pool)


def load(wire: Wire, peer: PeerBlocks, copy: bool) -> Any:
    """The value of ``wire``. Its arrays are views of the sender's blocks, or
    with ``copy`` this process's own copies (for a value that outlives the
    blocks)."""
    if isinstance(wire, bytes):
        return pickle.loads(wire)
    if not isinstance(wire, tuple):
        return wire  # a plain value
    _, payload, refs = wire
    views: Sequence[Any] = [peer.view(name, nbytes) for name, nbytes in refs]
    if copy:
        views = [bytearray(view) for view in views]
    return pickle.loads(payload, buffers=views)


def block_names(wire: Wire) -> List[str]:
    """The names of the blocks ``wire`` refers to."""
    return [name for name, _ in wire[2]] if isinstance(wire, tuple) else []
