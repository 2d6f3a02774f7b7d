"""CUDA devices as the options name them (``cuda_devices``, ``--devices``):
how a value is read and checked, and how a device is shown. Apart from
:mod:`streamer_core.options.config` because they are one subject of their own."""

from __future__ import annotations

import re
from typing import Any, Optional, Tuple, Union

__all__ = ["DeviceId", "shown_device", "parse_devices", "devices_checked"]

#: A CUDA device as ``CUDA_VISIBLE_DEVICES`` takes it: an index or a UUID string.
DeviceId = Union[int, str]


def shown_device(device: Optional[DeviceId]) -> str:
    """A worker's device as the logs and the status commands name it:
    ``default`` where none was given (``CUDA_VISIBLE_DEVICES`` left as it is)."""
    return "default" if device is None else str(device)


def parse_devices(value: Any) -> Any:
    """Accept ``"0,1"`` (as an environment variable or ``--devices`` gives
    it) as ``[0, 1]``; anything else is returned as it is, to be checked."""
    if isinstance(value, str):
        parts = [part.strip() for part in value.split(",") if part.strip()]
        return [int(part) if part.lstrip("-").isdigit() else part for part in parts]
    return value


#: How ``CUDA_VISIBLE_DEVICES`` names a device other than by index: its
#: UUID as ``nvidia-smi -L`` lists it, a GPU's or a MIG instance's.
_UUID_PREFIXES = ("GPU-", "MIG-")
# torch's name of a device, "cuda:1": the index.
_TORCH_DEVICE = re.compile(r"cuda:(\d+)\Z")


def _device(device: Any) -> DeviceId:
    """One device: an index, ``"cuda:N"`` (torch's name: the index ``N``)
    or a UUID; refused with how to write it otherwise."""
    if isinstance(device, bool) or not isinstance(device, (int, str)):
        raise TypeError(f"holds {device!r}: each device must be an int index (0, 1, ...) or a GPU UUID string")
    if isinstance(device, int):
        if device < 0:
            raise ValueError(f"holds {device!r}: device indexes start at 0")
        return device
    text = device.strip()
    torch_name = _TORCH_DEVICE.match(text)
    if torch_name:
        return int(torch_name.group(1))
    if text.isdigit():
        return int(text)
    if not text.startswith(_UUID_PREFIXES) or len(text) <= 4:
        raise ValueError(
            f"holds {device!r}: name a device by its index (0, 1, or 'cuda:1' as torch writes it) or by its UUID "
            "('GPU-...' or 'MIG-...', as nvidia-smi -L lists them)"
        )
    return text


def devices_checked(value: Any) -> Optional[Tuple[DeviceId, ...]]:
    """CUDA devices: a list of indexes or GPU UUIDs, ``"0,1"``, or one
    device alone (``0``, as a one-GPU box is set up, or ``FLASK_..._CUDA_DEVICES=0``
    arrives once Flask reads it as JSON); ``None`` leaves
    ``CUDA_VISIBLE_DEVICES`` alone."""
    if value is None:
        return None
    devices = parse_devices(value)
    if isinstance(devices, int) and not isinstance(devices, bool):
        devices = [devices]
    if not isinstance(devices, (list, tuple)):
        raise TypeError(
            f"must be a device index such as 0, a list of them such as [0, 1] (or the string '0,1'), got {value!r}"
        )
    if not devices:
        raise ValueError("must name at least one device, or be None to leave CUDA_VISIBLE_DEVICES alone")
    return tuple(_device(device) for device in devices)
