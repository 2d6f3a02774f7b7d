"""ManagedModel: a model that is built inside its worker, on its device."""

from __future__ import annotations

import os
from typing import Any, List, Optional

from .config import DeviceId

__all__ = ["ManagedModel"]


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
