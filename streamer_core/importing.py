"""Objects named by import path, as settings and commands name models and functions."""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["import_target"]


def import_target(path: str) -> Any:
    """``"package.module:Name"`` (or ``"package.module.Name"``) to the object."""
    module_name, sep, attribute = path.partition(":")
    if not sep:
        module_name, _, attribute = path.rpartition(".")
    if not module_name or not attribute:
        raise ValueError(f"name the model as module:attribute, e.g. myapp.ml:Embedder (got {path!r})")
    try:
        target: Any = importlib.import_module(module_name)
    except ImportError as exc:
        raise ValueError(f"cannot import {module_name!r} (from {path!r}): {exc}") from exc
    for part in attribute.split("."):
        try:
            target = getattr(target, part)
        except AttributeError:
            raise ValueError(f"{module_name!r} has no attribute {attribute!r}") from None
    return target
