"""Models for the tests. Spawned workers import them by name, so they live
at module level here rather than inside the tests."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any, List

from streamer_core import ManagedModel


def double(batch: List[Any]) -> List[Any]:
    return [x * 2 for x in batch]


def fail_on_negative(batch: List[int]) -> List[int]:
    bad = [x for x in batch if x < 0]
    if bad:
        raise ValueError(f"negative input {bad[0]}")
    return [x * 2 for x in batch]


def exit_on_negative(batch: List[int]) -> List[int]:
    """Raises SystemExit (as a library's fatal-error path may) on a negative input."""
    if any(x < 0 for x in batch):
        raise SystemExit(3)
    return [x * 2 for x in batch]


def stuck_on_hang(batch: List[str]) -> List[str]:
    """Never returns from a batch holding "hang" (a deadlock); takes 1.5 s
    over one holding "slow"; else each input in upper case."""
    if "hang" in batch:
        threading.Event().wait()
    if "slow" in batch:
        time.sleep(1.5)
    return [x.upper() for x in batch]


def one_short(batch: List[Any]) -> List[Any]:
    return batch[:-1]


def returns_none(batch: List[Any]) -> None:
    return None


def unpicklable_result(batch: List[Any]) -> List[Any]:
    return [(lambda: None) if x == "lambda" else x for x in batch]


def batch_info(batch: List[Any]) -> List[Any]:
    """Each input with the size of the batch it was in and the worker's pid."""
    return [(x, len(batch), os.getpid()) for x in batch]


def with_batch(batch: List[Any]) -> List[Any]:
    """Each input with the whole batch it was in, so a test can tell the batches apart."""
    time.sleep(0.005)
    return [(x, list(batch)) for x in batch]


def kill_self_on_poison(batch: List[str]) -> List[str]:
    time.sleep(0.02)
    if "poison" in batch:
        os.kill(os.getpid(), signal.SIGKILL)
    return [s.upper() for s in batch]


class EnvModel(ManagedModel):
    """Reports the device it was given and what CUDA would see."""

    def init_model(self, tag: str = "", delay: float = 0.0) -> None:
        self.tag = tag
        self.delay = delay

    def predict(self, batch: List[Any]) -> List[Any]:
        time.sleep(self.delay)
        return [
            {"pid": os.getpid(), "cvd": os.environ.get("CUDA_VISIBLE_DEVICES"), "gpu_id": self.gpu_id, "tag": self.tag}
            for _ in batch
        ]


class TorchDoubler(ManagedModel):
    """Doubles its inputs with torch, imported as it loads, as a real model's is."""

    def init_model(self) -> None:
        import torch

        self.torch = torch

    def predict(self, batch: List[Any]) -> List[Any]:
        return [float(self.torch.tensor(float(x)) * 2) for x in batch]


class BrokenInitModel(ManagedModel):
    def init_model(self) -> None:
        raise FileNotFoundError("weights.bin not found")

    def predict(self, batch: List[Any]) -> List[Any]:  # pragma: no cover - never reached
        return batch


class DiesWhileLoading(ManagedModel):
    """Its worker process dies as the model loads (a crash in native code,
    an out-of-memory kill), every time."""

    def init_model(self) -> None:
        os._exit(9)

    def predict(self, batch: List[Any]) -> List[Any]:  # pragma: no cover - never reached
        return batch


class HoldModel(ManagedModel):
    """While the file ``hold`` exists in ``folder``, a batch announces itself
    (file ``inside-<pid>``) and waits, so a test can kill a worker mid-batch.
    A worker that has loaded leaves ``loaded-<pid>`` there."""

    def init_model(self, folder: str) -> None:
        self.folder = Path(folder)
        (self.folder / f"loaded-{os.getpid()}").write_text("")

    def predict(self, batch: List[Any]) -> List[Any]:
        if (self.folder / "hold").exists():
            (self.folder / f"inside-{os.getpid()}").write_text(repr(batch))
            deadline = time.monotonic() + 10
            while (self.folder / "hold").exists() and time.monotonic() < deadline:
                time.sleep(0.005)
        return [x * 2 for x in batch]


class SlowLoadingModel(ManagedModel):
    """Takes ``seconds`` to load and says it runs on ``device``."""

    def init_model(self, seconds: float = 0.3, device: str = "cuda:7") -> None:
        time.sleep(seconds)
        self.device = device

    def predict(self, batch: List[Any]) -> List[Any]:
        return batch


class MarkedSlowLoading(ManagedModel):
    """Writes ``folder/loading-<pid>`` as its loading starts, then takes
    ``seconds`` to load: a test knows the worker is inside ``init_model``."""

    def init_model(self, folder: str, seconds: float = 2.0) -> None:
        (Path(folder) / f"loading-{os.getpid()}").write_text("")
        time.sleep(seconds)

    def predict(self, batch: List[Any]) -> List[Any]:
        return batch


class GatedFailOnNegative(ManagedModel):
    """Several callers' inputs in one batch: a batch holding ``0`` waits while
    ``folder/hold`` exists (announcing itself with ``inside-<pid>``), so the
    calls after it queue up and go together; a batch with a negative input
    fails; each batch is appended to ``folder/batches.jsonl``."""

    def init_model(self, folder: str) -> None:
        self.folder = Path(folder)

    def predict(self, batch: List[int]) -> List[int]:
        with (self.folder / "batches.jsonl").open("a") as log:
            log.write(json.dumps(batch) + "\n")
        if 0 in batch:
            (self.folder / f"inside-{os.getpid()}").write_text(repr(batch))
            deadline = time.monotonic() + 10
            while (self.folder / "hold").exists() and time.monotonic() < deadline:
                time.sleep(0.005)
        return fail_on_negative(batch)


class FakeOutOfMemory(RuntimeError):
    """Stands for a GPU's out-of-memory error in the tests."""


class MemoryBoundModel(ManagedModel):
    """Runs out of memory (:class:`FakeOutOfMemory`) on any batch whose
    inputs add up to more than ``limit``, a limit the streamer is not told;
    answers each input with how many times it has run out so far."""

    def init_model(self, limit: int = 40) -> None:
        self.limit = limit
        self.ran_out = 0

    def predict(self, batch: List[int]) -> List[Any]:
        if sum(batch) > self.limit:
            self.ran_out += 1
            raise FakeOutOfMemory(f"a batch of {sum(batch)} does not fit in {self.limit}")
        return [(x * 2, self.ran_out) for x in batch]


class NoRoomToLoad(ManagedModel):
    """Runs out of memory (:class:`FakeOutOfMemory`) while it loads, as a
    model does on a GPU that another process holds."""

    def init_model(self) -> None:
        raise FakeOutOfMemory("tried to allocate 90 MiB; 0 bytes free")

    def predict(self, batch: List[Any]) -> List[Any]:  # pragma: no cover - never reached
        return batch


def _in_shared_memory(array: Any) -> bool:
    """Whether ``array``'s bytes lie in a mapping of a file under /dev/shm."""
    address = array.__array_interface__["data"][0]
    with open("/proc/self/maps") as maps:
        for line in maps:
            span, *rest = line.split(maxsplit=5)
            start, end = (int(x, 16) for x in span.split("-"))
            if start <= address < end:
                return len(rest) == 5 and rest[4].strip().startswith("/dev/shm/")
    return False


def describe_arrays(batch: List[Any]) -> List[Any]:
    """For each input array: its sum, dtype, shape, and whether the model saw
    it in shared memory; then the array doubled, as the result."""
    return [
        {
            "sum": float(x.sum()),
            "dtype": str(x.dtype),
            "shape": list(x.shape),
            "shared": _in_shared_memory(x),
            "doubled": x * 2,
        }
        for x in batch
    ]


def echo_tensors(batch: List[Any]) -> List[Any]:
    """CPU torch tensors: each plus one, and whether it arrived as a tensor
    viewing shared memory."""
    import torch

    return [(type(t) is torch.Tensor and _in_shared_memory(t.numpy()), t + 1) for t in batch]


def big_arrays(batch: List[Any]) -> List[Any]:
    """A (256, 256) float32 array (256 KB) filled with each input. An input
    ``"hold:<path>"`` writes that file and sleeps (so a test can kill the
    worker in the middle of a batch)."""
    import numpy

    for x in batch:
        if isinstance(x, str) and x.startswith("hold:"):
            Path(x[5:]).write_text("in the model")
            time.sleep(30)
    return [numpy.full((256, 256), x, dtype=numpy.float32) for x in batch]


def double_arrays(batch: List[Any]) -> List[Any]:
    """Each array doubled; an array starting with -1 kills the worker."""
    if any(x.flat[0] == -1 for x in batch):
        os.kill(os.getpid(), signal.SIGKILL)
    return [x * 2 for x in batch]


def cores(batch: List[Any]) -> List[Any]:
    """The CPU cores this worker may run on, for each input."""
    return [sorted(os.sched_getaffinity(0)) for _ in batch]


def frozen_objects(batch: List[Any]) -> List[Any]:
    """How many objects this worker keeps out of the cyclic collector's sight, for each input."""
    import gc

    return [gc.get_freeze_count() for _ in batch]


def slow_double(batch: List[Any]) -> List[Any]:
    """Doubles, taking 0.1 s a batch: a model a few callers keep busy."""
    time.sleep(0.1)
    return [x * 2 for x in batch]


class TracedDouble(ManagedModel):
    """Doubles its inputs; as it loads, sets up OpenTelemetry in its worker
    process to write the spans there to ``path`` (the hook the README's
    "Tracing" describes)."""

    def init_model(self, path: str) -> None:
        from tests.spans import export_to_file

        export_to_file(path)

    def predict(self, batch: List[Any]) -> List[Any]:
        return [x * 2 for x in batch]


class RecordingGate(ManagedModel):
    """Appends every batch it runs to ``folder/ran.jsonl`` (a line each); a batch holding
    ``"hold"`` announces itself (file ``inside``) and waits while the file
    ``hold`` exists in ``folder``. Answers ``ok:<input>``: a test of the
    process backend sees what reached the model, and holds it busy."""

    def init_model(self, folder: str) -> None:
        self.folder = Path(folder)

    def predict(self, batch: List[Any]) -> List[Any]:
        with (self.folder / "ran.jsonl").open("a") as f:
            f.write(json.dumps(batch) + "\n")
        if "hold" in batch and (self.folder / "hold").exists():
            (self.folder / "inside").write_text("")
            deadline = time.monotonic() + 15
            while (self.folder / "hold").exists() and time.monotonic() < deadline:
                time.sleep(0.005)
        return [f"ok:{x}" for x in batch]


def ran_batches(folder: Path) -> List[List[Any]]:
    """The batches :class:`RecordingGate` ran, in order."""
    path = folder / "ran.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def ran_inputs(folder: Path) -> List[Any]:
    """The inputs :class:`RecordingGate` ran, in order."""
    return [x for batch in ran_batches(folder) for x in batch]


class ProgressBarModel(ManagedModel):
    """Loads as transformers does, drawing a tqdm progress bar (to a
    string, not the test's output); answers with its pid."""

    def init_model(self) -> None:
        import io

        from tqdm import tqdm

        for _ in tqdm(range(3), file=io.StringIO()):
            pass

    def predict(self, batch: List[Any]) -> List[Any]:
        return [os.getpid()] * len(batch)


def _rebuilt_outside_workers(value: int) -> Box:
    if os.environ.get("STREAMER_CORE_WORKER"):
        raise ValueError("this box cannot be rebuilt in a worker")
    return Box(value)


class Box:
    """An input that pickles, and, ``poisoned``, cannot be unpickled in a
    worker process: the worker's own failure for that one input."""

    def __init__(self, value: int, poisoned: bool = False) -> None:
        self.value, self.poisoned = value, poisoned

    def __reduce__(self) -> Any:
        return (_rebuilt_outside_workers, (self.value,)) if self.poisoned else (Box, (self.value,))


def unbox(batch: List[Any]) -> List[Any]:
    """Each Box's value times ten; ``"sleep"`` holds the batch a second."""
    out: List[Any] = []
    for x in batch:
        if x == "sleep":
            time.sleep(1.0)
            out.append("slept")
        else:
            out.append(x.value * 10)
    return out
