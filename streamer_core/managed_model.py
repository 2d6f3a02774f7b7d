"""ManagedModel: a model that is built inside its worker, on its device."""

from __future__ import annotations

import os
from typing import Any, Callable, Dict, List, Optional, Sequence

from .config import DeviceId

__all__ = ["ManagedModel", "check_model", "load_predict"]


class ManagedModel:
    """Subclass this to have each worker build its own copy of the model.

    The worker process sets ``CUDA_VISIBLE_DEVICES`` to its device, then calls
    ``Model(gpu_id)`` and ``init_model(*model_init_args, **model_init_kwargs)``,
    and only then ``predict(batch)`` for each batch. Load weights and move
    them to the GPU in ``init_model``, not at import time, so each worker uses
    its own device (inside the worker that device is ``cuda:0``).

    Same interface as service_streamer's ``ManagedModel``.
    """

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
        instance = model(gpu_id)
        instance.init_model(*args, **kwargs)
        return instance.predict
    return model
