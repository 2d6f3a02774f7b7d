"""The models the Django tests serve: batch functions and ManagedModels that
show what they were given (each input's batch size, the worker's pid), fail
on demand, hold a batch until a file disappears, or leave a mark when built."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any, List, Optional

import numpy as np

from streamer_core import ManagedModel


def double(batch: List[Any]) -> List[Any]:
    """``x * 2``; raises ValueError for the input "boom" (one 500, not the batch's)."""
    if "boom" in batch:
        raise ValueError("the model refuses 'boom'")
    return [x * 2 for x in batch]


def vectors(batch: List[Any]) -> Any:
    """Input "n" -> a float32 array of n values (as an embedding model
    answers); "set" -> a set, which has no JSON form."""
    if "set" in batch:
        return [{1, 2}] * len(batch)
    return [np.linspace(0.1, 1.0, int(n), dtype=np.float32) / 3 for n in batch]


def sizes(batch: List[Any]) -> List[Any]:
    """``[x, batch size]`` per input, a little slowly so concurrent calls meet."""
    time.sleep(0.3)
    return [[x, len(batch)] for x in batch]


def with_batch(batch: List[Any]) -> List[Any]:
    """``[x, the whole batch]`` per input."""
    time.sleep(0.005)
    return [[x, list(batch)] for x in batch]


def text_cost(text: Any) -> int:
    """An ``ITEM_COST``: a text's length; anything else cannot be costed."""
    if not isinstance(text, str):
        raise TypeError(f"expected a text, got {type(text).__name__}")
    return len(text)


def slow(batch: List[Any]) -> List[Any]:
    """Takes longer than the tests' short TIMEOUT."""
    time.sleep(1.0)
    return batch


def with_pid(batch: List[Any]) -> List[Any]:
    """``[x, pid of the worker]`` per input."""
    return [[x, os.getpid()] for x in batch]


class HoldModel(ManagedModel):
    """Doubles its inputs, but first waits while ``folder/hold`` exists,
    having written ``folder/inside-<pid>``: a batch the test can keep in hand."""

    def init_model(self, folder: str) -> None:
        self.folder = Path(folder)

    def predict(self, batch: List[Any]) -> List[Any]:
        (self.folder / f"inside-{os.getpid()}").write_text(repr(batch))
        deadline = time.monotonic() + 30
        while (self.folder / "hold").exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        return [x * 2 for x in batch]


class MarkedModel(ManagedModel):
    """Writes ``folder/built-<pid>`` when built: proof that something started it."""

    def init_model(self, folder: Optional[str] = None) -> None:
        if folder:
            Path(folder, f"built-{os.getpid()}").write_text("")

    def predict(self, batch: List[Any]) -> List[Any]:
        return batch


class BrokenModel(ManagedModel):
    """A model whose loading fails: no worker can start (503)."""

    def init_model(self) -> None:
        raise RuntimeError("the weights are missing")

    def predict(self, batch: List[Any]) -> List[Any]:  # pragma: no cover - never built
        return batch


NOT_A_MODEL = 42


class NotManaged:
    """A class that is not a ManagedModel subclass."""


def describe_upload(batch: List[Any]) -> List[Any]:
    """What arrived of each upload: its type, length and first bytes."""
    return [
        {"type": type(x).__name__, "length": len(x), "head": x[:8].hex() if isinstance(x, bytes) else x} for x in batch
    ]


class SlowLoading(ManagedModel):
    """Takes ``seconds`` to load (as a real model does), then gives each
    input's length: a first request that loads it must not block the loop."""

    def init_model(self, seconds: float = 0.6) -> None:
        time.sleep(seconds)

    def predict(self, batch: List[Any]) -> List[Any]:
        return [len(x) for x in batch]
