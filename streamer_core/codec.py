"""How inputs, results and errors are written to a broker (Redis).

Anything read from a broker may have been written by someone else, so the
default codec, ``"msgpack"``, can only produce plain data: ``None``, bools,
numbers, strings, bytes, lists, dicts, and numpy arrays through one explicit
extension type (dtype, shape and raw bytes; object arrays are refused). Tuples
come back as lists. ``"pickle"`` carries any Python object but runs code when
read; it is used only when both the web side and the workers ask for it.

Errors cross as plain data too (type name, message, formatted traceback) and
are re-created as the same built-in or ``streamer_core`` exception type where
there is one, as :class:`RemoteError` otherwise.
"""

from __future__ import annotations

import builtins
import pickle
import traceback
from typing import Any, Dict

from . import errors as _errors
from .errors import RemoteError, RemoteTraceback, SerializationError

__all__ = ["Codec", "get_codec", "CODECS", "encode_error", "decode_error"]

_NUMPY_EXT = 1


class Codec:
    """Turns a value into bytes and back. ``name`` is written next to each
    payload, so a reader refuses payloads of another codec."""

    name = ""

    def encode(self, value: Any) -> bytes:
        raise NotImplementedError

    def decode(self, data: bytes) -> Any:
        raise NotImplementedError


class MsgpackCodec(Codec):
    """Plain data and numpy arrays; never runs code when decoding."""

    name = "msgpack"

    def __init__(self) -> None:
        try:
            import msgpack
        except ImportError:  # pragma: no cover - msgpack comes with the redis extra
            raise ImportError(
                "the msgpack codec needs the msgpack package: pip install 'streamer-core[redis]'"
            ) from None
        self._msgpack = msgpack

    def encode(self, value: Any) -> bytes:
        try:
            return self._msgpack.packb(value, default=self._encode_ext, use_bin_type=True)
        except (TypeError, ValueError, OverflowError) as exc:
            raise SerializationError(
                f"{type(value).__name__} cannot be written with the msgpack codec ({exc}): send plain data "
                "(None, bool, numbers, str, bytes, lists, dicts, numpy arrays), or opt in to codec='pickle' "
                "on both the web side and the workers if the broker is trusted"
            ) from exc

    def decode(self, data: bytes) -> Any:
        try:
            return self._msgpack.unpackb(data, ext_hook=self._decode_ext, raw=False, strict_map_key=False)
        except Exception as exc:
            raise SerializationError(f"not a valid msgpack payload ({exc})") from exc

    def _encode_ext(self, value: Any) -> Any:
        module = type(value).__module__
        if module == "numpy" and type(value).__name__ == "ndarray":
            if value.dtype.hasobject:
                raise TypeError("numpy arrays of Python objects cannot be sent")
            header = self._msgpack.packb([value.dtype.str, list(value.shape)])
            return self._msgpack.ExtType(_NUMPY_EXT, header + value.tobytes(order="C"))
        if module == "numpy" and hasattr(value, "item"):  # a numpy scalar
            return value.item()
        raise TypeError(f"cannot encode {type(value).__name__}")

    def _decode_ext(self, code: int, data: bytes) -> Any:
        if code != _NUMPY_EXT:
            raise ValueError(f"unknown msgpack extension type {code}")
        import numpy

        unpacker = self._msgpack.Unpacker(raw=False)
        unpacker.feed(data)
        dtype, shape = next(unpacker)
        offset = unpacker.tell()
        dtype = numpy.dtype(dtype)
        if dtype.hasobject:
            raise ValueError("refusing a numpy array of Python objects")
        return numpy.frombuffer(data, dtype=dtype, offset=offset).reshape(shape).copy()


class PickleCodec(Codec):
    """Any picklable object. Decoding runs code: use only with a trusted broker."""

    name = "pickle"

    def encode(self, value: Any) -> bytes:
        try:
            return pickle.dumps(value, pickle.HIGHEST_PROTOCOL)
        except Exception as exc:
            raise SerializationError(f"{type(value).__name__} cannot be pickled: {exc}") from exc

    def decode(self, data: bytes) -> Any:
        return pickle.loads(data)


CODECS: Dict[str, type] = {"msgpack": MsgpackCodec, "pickle": PickleCodec}


def get_codec(name: str) -> Codec:
    """The codec called ``name``; a clear error for any other name."""
    if name not in CODECS:
        raise ValueError(f"codec must be one of {sorted(CODECS)}, got {name!r}")
    return CODECS[name]()


def encode_error(exc: BaseException) -> Dict[str, str]:
    """An exception as plain data: its type name, message and traceback."""
    return {
        "type": type(exc).__name__,
        "message": str(exc),
        "traceback": "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)),
    }


def decode_error(data: Any) -> BaseException:
    """Re-create an exception written by :func:`encode_error`: the built-in
    or streamer_core type of that name, else :class:`RemoteError`."""
    if not isinstance(data, dict):
        return RemoteError("InvalidErrorPayload", repr(data)[:200])
    name, message = str(data.get("type", "Exception")), str(data.get("message", ""))
    cls = getattr(_errors, name, None) if name in _errors.__all__ else None
    if cls is None:
        candidate = getattr(builtins, name, None)
        if isinstance(candidate, type) and issubclass(candidate, Exception):
            cls = candidate
    exc: BaseException
    try:
        exc = cls(message) if cls is not None and cls is not RemoteError else RemoteError(name, message)
    except Exception:
        exc = RemoteError(name, message)
    exc.__cause__ = RemoteTraceback(str(data.get("traceback", "")))
    return exc

