"""``--stub-forward`` of ``bench/scale_bench.py``: with this folder on
``PYTHONPATH``, every Python process of a deployment (web processes, the
workers they spawn, Redis workers) runs the sentence model with its
transformer's forward pass replaced by one that returns right-shaped token
embeddings at once, and the image model (``--images``) with its forward
pass replaced by one that returns 1,000 class scores at once. The tokenizer, the pooling, the normalising, batching
and everything around the model still run: what is left is the CPU a
request costs outside the model's forward pass. torch runs what is left of
it (the stub's own tensor, the pooling) on one thread: on a GPU that work
is the device's, and torch's idle threads spinning on a CPU would be
counted as the request's.

Patched when ``sentence_transformers`` or ``efficientnet_lite_pytorch`` is
first imported (this runs at every interpreter's start, and must not import
them itself: torch is heavy).
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import sys
import warnings
from typing import Any, Optional, Sequence


def _stub_forward(module: Any) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from sentence_transformers.models import Transformer
    import torch

    torch.set_num_threads(1)

    def forward(self: Any, features: Any, **kwargs: Any) -> Any:
        ids = features["input_ids"]
        hidden = self.auto_model.config.hidden_size
        name = getattr(self, "module_output_name", "token_embeddings")
        features[name] = torch.ones(ids.shape[0], ids.shape[1], hidden, device=ids.device)
        return features

    Transformer.forward = forward


def _stub_image_forward(module: Any) -> None:
    import torch

    torch.set_num_threads(1)

    def forward(self: Any, inputs: Any) -> Any:
        return torch.zeros(inputs.shape[0], 1000, device=inputs.device)

    module.EfficientNet.forward = forward


_STUBS = {"sentence_transformers": _stub_forward, "efficientnet_lite_pytorch": _stub_image_forward}


class _Hook(importlib.abc.MetaPathFinder):
    def __init__(self, name: str) -> None:
        self.name = name

    def find_spec(self, name: str, path: Optional[Sequence[str]], target: Any = None) -> Any:
        if name != self.name:
            return None
        sys.meta_path.remove(self)
        stub = _STUBS[name]
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None:
            return spec
        loader: Any = spec.loader
        run = loader.exec_module

        def exec_module(module: Any) -> None:
            run(module)
            stub(module)

        loader.exec_module = exec_module
        return spec


for _name in _STUBS:
    sys.meta_path.insert(0, _Hook(_name))
