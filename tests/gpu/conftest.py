"""The ``gpu`` marker and its skip, and the Redis fixtures for the tests of
Redis workers on GPUs."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import List, Optional

import pytest

from tests.redis.conftest import (  # noqa: F401  (fixtures the Redis test here uses)
    Broker,
    Processes,
    broker,
    make_streamer,
    procs,
    running,
)

HERE = Path(__file__).resolve().parent


@functools.cache
def no_cuda_reason() -> Optional[str]:
    """Why the GPU tests cannot run here, or ``None`` where they can."""
    try:
        import torch
    except ImportError:
        return "needs torch with CUDA; torch is not installed"
    if not torch.cuda.is_available():
        return f"needs a CUDA device; torch {torch.__version__} sees none (torch.cuda.is_available() is False)"
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: List[pytest.Item]) -> None:
    reason = None
    for item in items:
        if HERE not in Path(item.path).resolve().parents:
            continue
        item.add_marker(pytest.mark.gpu)
        reason = reason or no_cuda_reason()
        if reason:
            item.add_marker(pytest.mark.skip(reason=reason))
