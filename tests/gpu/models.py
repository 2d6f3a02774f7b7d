"""Models for the GPU tests, at module level: spawned workers import them by
name. torch is imported inside them, so the test modules import cheaply."""

from __future__ import annotations

import os
from typing import Any, Dict, List

from streamer_core import ManagedModel


def device_facts() -> Dict[str, Any]:
    """Where this process computes: what CUDA sees, by index and by UUID."""
    import torch

    current = torch.cuda.current_device()
    properties = torch.cuda.get_device_properties(current)
    return {
        "pid": os.getpid(),
        "visible": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "current": current,
        "uuid": str(getattr(properties, "uuid", properties.name)),
    }


class WhereAmI(ManagedModel):
    """A layer on ``cuda``; answers where it and its process are."""

    def init_model(self) -> None:
        import torch

        self.layer = torch.nn.Linear(4, 4).to("cuda")

    def predict(self, batch: List[Any]) -> List[Any]:
        import torch

        with torch.inference_mode():
            self.layer(torch.zeros(len(batch), 4, device="cuda"))
        facts = {**device_facts(), "parameters": sorted({str(p.device) for p in self.layer.parameters()})}
        return [facts for _ in batch]


class Greedy(ManagedModel):
    """Takes ``bytes_per_item`` of GPU memory for each input of a batch, for
    real: a batch too large for the card raises torch's own
    ``torch.cuda.OutOfMemoryError``. Answers each input doubled."""

    def init_model(self, bytes_per_item: int) -> None:
        self.bytes_per_item = bytes_per_item

    def predict(self, batch: List[int]) -> List[int]:
        import torch

        block = torch.ones(len(batch) * self.bytes_per_item, dtype=torch.uint8, device="cuda")
        torch.cuda.synchronize()
        del block
        return [x * 2 for x in batch]


class NeedsMemory(ManagedModel):
    """Takes ``bytes_needed`` of GPU memory as it loads, as weights do."""

    def init_model(self, bytes_needed: int) -> None:
        import torch

        self.weights = torch.ones(bytes_needed, dtype=torch.uint8, device="cuda")

    def predict(self, batch: List[Any]) -> List[Any]:
        return batch
