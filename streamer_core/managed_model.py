"""ManagedModel: a model that is built inside its worker, on its device."""

from __future__ import annotations

import gc
import logging
import os
import sys
import time
from typing import Any, Callable, Dict, List, NamedTuple, Optional, Sequence

from .options.config import DeviceId

__all__ = [
    "ManagedModel",
    "ModelFacts",
    "check_model",
    "freeze_loaded",
    "load_predict",
    "model_facts",
    "ready_line",
    "warn_without_cuda",
]

logger = logging.getLogger("streamer_core")


class ManagedModel:
    """Subclass this to have each worker build its own copy of the model.

    The worker process sets ``CUDA_VISIBLE_DEVICES`` to its device, then calls
    ``Model(gpu_id)`` and ``init_model(*model_init_args, **model_init_kwargs)``,
    and only then ``predict(batch)`` for each batch. Load weights and move
    them to the GPU in ``init_model``, not at import time, so each worker uses
    its own device (inside the worker that device is ``cuda:0``).

    Same interface as service_streamer's ``ManagedModel``. A ``device``
    attribute, if the subclass has one (e.g. ``"cuda:0"``), is named in the
    line logged when the model is ready.
    """

    #: Seconds ``__init__`` and ``init_model`` took, where the model was built.
    load_seconds: float = 0.0

    def __init__(self, gpu_id: Optional[DeviceId] = None) -> None:
        self.model: Any = None
        self.gpu_id = gpu_id
        self.set_gpu_id(gpu_id)

    @staticmethod
    def set_gpu_id(gpu_id: Optional[DeviceId] = None) -> None:
        """Make only ``gpu_id`` visible to CUDA in this process (device 0 too)."""
        if gpu_id is not None:
            os.environ["CUDA_VISIBLE_DEVICES"] = str(gpu_id)

    def init_model(self, *args: Any, **kwargs: Any) -> None:
        raise NotImplementedError("subclasses of ManagedModel build their model in init_model()")

    def predict(self, batch: List[Any]) -> List[Any]:
        raise NotImplementedError("subclasses of ManagedModel implement predict(batch) -> list")


def check_model(name: str, model: Any) -> None:
    """Refuse anything but a ManagedModel subclass or a function taking a list."""
    if isinstance(model, type):
        if not issubclass(model, ManagedModel):
            raise TypeError(
                f"{model.__name__} is a class but not a ManagedModel subclass: pass a ManagedModel subclass "
                "(built in each worker) or a function taking a list"
            )
    elif not callable(model):
        raise TypeError(f"{name} must be a function or a ManagedModel subclass, got {model!r}")


def load_predict(
    model: Any, gpu_id: Optional[Any], args: Sequence[Any], kwargs: Dict[str, Any]
) -> Callable[[List[Any]], Any]:
    """In a worker: build a ManagedModel subclass on ``gpu_id`` and return its
    ``predict``; a plain function is returned as it is."""
    if isinstance(model, type) and issubclass(model, ManagedModel):
        started = time.monotonic()
        instance = model(gpu_id)
        instance.init_model(*args, **kwargs)
        instance.load_seconds = time.monotonic() - started
        warn_without_cuda(gpu_id)
        return instance.predict
    warn_without_cuda(gpu_id)
    predict: Callable[[List[Any]], Any] = model
    return predict


def warn_without_cuda(gpu_id: Optional[Any]) -> None:
    """Say so, once the model is loaded, where a device was asked for and
    torch (loaded with the model) sees no CUDA device: the model computes
    on the CPU, which nothing else would tell (the machine has no GPU, or
    ``CUDA_VISIBLE_DEVICES`` names none that exists). Nothing is said of a
    model that does not use torch."""
    torch = sys.modules.get("torch")
    if gpu_id is None or torch is None:
        return
    try:
        available = bool(torch.cuda.is_available())
    except Exception:  # noqa: BLE001 - a broken CUDA set-up: the model says it when it runs
        return
    if not available:
        logger.warning(
            "device %s was asked for, but torch sees no CUDA device in this process (CUDA_VISIBLE_DEVICES=%s): "
            "the model runs on the CPU; check the index or UUID (nvidia-smi -L lists them), or ask for no device",
            gpu_id,
            os.environ.get("CUDA_VISIBLE_DEVICES"),
        )


def freeze_loaded() -> None:
    """In a worker process whose model has just loaded: keep every object
    alive now (the model's, and the modules of torch and its kin, often some
    hundreds of thousands) out of the cyclic garbage collector's sight
    (``gc.freeze()``). They live as long as the worker, and a full collection
    that walked them all took hundreds of milliseconds with a model loaded,
    stalling every batch in hand; frozen, it takes milliseconds."""
    gc.freeze()


class ModelFacts(NamedTuple):
    """What the ready line says of a loaded model (picklable: a worker
    process sends it to its parent)."""

    name: str
    device: str
    seconds: float


def model_facts(predict: Any, gpu_id: Optional[DeviceId]) -> ModelFacts:
    """The model's name, its device (its ``device`` attribute, else the GPU
    it was given, else ``cpu``) and how long it took to load."""
    instance = getattr(predict, "__self__", None)
    if isinstance(instance, ManagedModel):
        name, device, seconds = type(instance).__qualname__, getattr(instance, "device", None), instance.load_seconds
    else:
        name = getattr(predict, "__qualname__", None) or getattr(predict, "__name__", None) or repr(predict)
        device, seconds = None, 0.0
    if device is None:
        device = f"GPU {gpu_id}" if gpu_id is not None else "cpu"
    return ModelFacts(name, str(device), seconds)


def ready_line(facts: ModelFacts, batch_size: int, max_latency: float, at_once: int = 1) -> str:
    """The one line a thread backend or worker logs when its model is ready
    (``at_once``: the batches it runs at once, said when more than one)."""
    together = f", {at_once} batches at once" if at_once > 1 else ""
    return (
        f"model {facts.name} ready on {facts.device} in {facts.seconds:.1f} s "
        f"(batch size {batch_size}, max latency {max_latency:g} s{together})"
    )
