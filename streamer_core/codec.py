"""How inputs, results and errors are written to a broker (Redis).

Anything read from a broker may have been written by someone else, so the
default codec, ``"msgpack"``, can only produce plain data: ``None``, bools,
numbers, strings, bytes, lists, dicts, and numpy arrays through one explicit
extension type (dtype, shape and raw bytes; object arrays are refused). Tuples
come back as lists. ``"pickle"`` carries any Python object but runs code when
read; it is used only when both the web side and the workers ask for it.

Large arrays travel out of band (:meth:`Codec.dumps`): the payload holds
their dtype and shape, and their raw bytes go beside it as separate buffers,
which Redis stores as fields of their own. An array is then copied once when
it is written (so that a caller changing it afterwards changes nothing sent)
and once when it is read (into a writable array), and never inside the
encoding.

Errors cross as plain data too (type name, message, formatted traceback) and
are re-created as the same built-in or ``streamer_core`` exception type where
there is one, as :class:`RemoteError` otherwise.
"""

from __future__ import annotations

import builtins
import io
import pickle
import traceback
from typing import Any, Dict, List, Sequence, Tuple, Type

from . import errors as _errors
from .errors import RemoteError, RemoteTraceback, SerializationError
from .options.config import OPTIONS

__all__ = ["Codec", "get_codec", "CODECS", "encode_error", "decode_error"]

_NUMPY_EXT = 1  # an array in the payload: [dtype, shape] then its bytes
_NUMPY_OOB_EXT = 2  # an array out of band: [dtype, shape, index of its buffer]
_HEADERS_KEPT = 256  # packed array headers kept by a codec
#: Arrays (and pickle buffers) of at least this many bytes travel out of band.
OUT_OF_BAND_BYTES = 64 * 1024

#: The raw bytes of large values, sent beside a payload.
Buffers = Tuple[bytes, ...]


class Codec:
    """Turns a value into bytes and back. ``name`` is written next to each
    payload, so a reader refuses payloads of another codec."""

    name = ""

    def encode(self, value: Any) -> bytes:
        """``value`` as one payload (large arrays inside it)."""
        raise NotImplementedError

    def decode(self, data: bytes) -> Any:
        raise NotImplementedError

    def dumps(self, value: Any) -> Tuple[bytes, Buffers]:
        """``value`` as a payload and the buffers of its large arrays."""
        return self.encode(value), ()

    def loads(self, data: bytes, buffers: Sequence[bytes] = ()) -> Any:
        """The value of :meth:`dumps`."""
        return self.decode(data)


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
        self._headers: Dict[Tuple[Any, ...], bytes] = {}

    def encode(self, value: Any) -> bytes:
        return self._pack(value, None)

    def decode(self, data: bytes) -> Any:
        return self.loads(data)

    def dumps(self, value: Any) -> Tuple[bytes, Buffers]:
        buffers: List[bytes] = []
        return self._pack(value, buffers), tuple(buffers)

    def loads(self, data: bytes, buffers: Sequence[bytes] = ()) -> Any:
        try:
            return self._msgpack.unpackb(
                data, ext_hook=lambda code, ext: self._decode_ext(code, ext, buffers), raw=False, strict_map_key=False
            )
        except Exception as exc:
            raise SerializationError(f"not a valid msgpack payload ({exc})") from exc

    def _pack(self, value: Any, buffers: Any) -> bytes:
        try:
            packed: bytes = self._msgpack.packb(
                value, default=lambda item: self._encode_ext(item, buffers), use_bin_type=True
            )
            return packed
        except (TypeError, ValueError, OverflowError) as exc:
            raise SerializationError(
                f"{type(value).__name__} cannot be written with the msgpack codec ({exc}): send plain data "
                "(None, bool, numbers, str, bytes, lists, dicts, numpy arrays), or opt in to codec='pickle' "
                "on both the web side and the workers if the broker is trusted"
            ) from exc

    def _encode_ext(self, value: Any, buffers: Any) -> Any:
        module = type(value).__module__
        if module == "numpy" and type(value).__name__ == "ndarray":
            if value.dtype.hasobject:
                raise TypeError("numpy arrays of Python objects cannot be sent")
            if buffers is not None and value.nbytes >= OUT_OF_BAND_BYTES:
                buffers.append(value.tobytes(order="C"))  # the one copy on this side
                header = self._header((value.dtype.str, value.shape, len(buffers) - 1))
                return self._msgpack.ExtType(_NUMPY_OOB_EXT, header)
            header = self._header((value.dtype.str, value.shape))
            return self._msgpack.ExtType(_NUMPY_EXT, header + value.tobytes(order="C"))
        if module == "numpy" and hasattr(value, "item"):  # a numpy scalar
            return value.item()
        raise TypeError(f"cannot encode {type(value).__name__}")

    def _header(self, key: Tuple[Any, ...]) -> bytes:
        """An array's header (its dtype, shape, and buffer's index), packed:
        kept, since a model answers arrays of a few shapes. Packing it here,
        inside the packing of the value it is part of, costs ten times what
        it costs alone (msgpack makes a new packer, and its buffer, each time)."""
        header = self._headers.get(key)
        if header is None:
            if len(self._headers) >= _HEADERS_KEPT:
                self._headers.clear()
            header = self._headers[key] = self._msgpack.packb([key[0], list(key[1]), *key[2:]])
        return header

    def _decode_ext(self, code: int, data: bytes, buffers: Sequence[bytes]) -> Any:
        import numpy

        unpacker = self._msgpack.Unpacker(raw=False)
        unpacker.feed(data)
        if code == _NUMPY_EXT:
            dtype, shape = next(unpacker)
            raw, offset = data, unpacker.tell()
        elif code == _NUMPY_OOB_EXT:
            dtype, shape, index = next(unpacker)
            if not isinstance(index, int) or not 0 <= index < len(buffers):
                raise ValueError("an array names a buffer that was not sent")
            raw, offset = buffers[index], 0
        else:
            raise ValueError(f"unknown msgpack extension type {code}")
        dtype = numpy.dtype(dtype)
        if dtype.hasobject:
            raise ValueError("refusing a numpy array of Python objects")
        return numpy.frombuffer(raw, dtype=dtype, offset=offset).reshape(shape).copy()  # the one copy on this side


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

    def dumps(self, value: Any) -> Tuple[bytes, Buffers]:
        try:
            payload, views = pickle_out_of_band(value, OUT_OF_BAND_BYTES)
            return payload, tuple(view.tobytes() for view in views)  # the one copy on this side
        except Exception as exc:
            raise SerializationError(f"{type(value).__name__} cannot be pickled: {exc}") from exc

    def loads(self, data: bytes, buffers: Sequence[bytes] = ()) -> Any:
        # Writable copies, so that arrays built on them are writable too.
        return pickle.loads(data, buffers=[bytearray(buffer) for buffer in buffers])


def pickle_out_of_band(
    value: Any, min_bytes: float, pickler: Type[pickle.Pickler] = pickle.Pickler
) -> Tuple[bytes, List[memoryview]]:
    """Pickle ``value`` (protocol 5, with ``pickler``), leaving out of the
    pickle each contiguous buffer (a numpy array's bytes) of at least
    ``min_bytes``: the pickle, and views of those buffers in the order
    ``pickle.loads(payload, buffers=...)`` takes them back. Shared by the
    pickle codec and the process backend's shared memory."""
    large: List[memoryview] = []

    def out_of_band(buffer: pickle.PickleBuffer) -> bool:
        try:
            view = buffer.raw()
        except BufferError:  # not contiguous: in the pickle
            return True
        if view.nbytes < min_bytes:
            return True
        large.append(view)
        return False

    if pickler is pickle.Pickler:
        return pickle.dumps(value, 5, buffer_callback=out_of_band), large
    stream = io.BytesIO()
    pickler(stream, 5, buffer_callback=out_of_band).dump(value)
    return stream.getvalue(), large


CODECS: Dict[str, Type[Codec]] = {"msgpack": MsgpackCodec, "pickle": PickleCodec}


def get_codec(name: str) -> Codec:
    """The codec called ``name``; a clear error for any other name."""
    return CODECS[OPTIONS["codec"].checked(name)]()


def encode_error(exc: BaseException) -> Dict[str, str]:
    """An exception as plain data: its type name, message and traceback.

    The message is the exception's one string argument where it has one, so
    that the type re-created from it reads the same (``str(KeyError("k"))``
    is ``"'k'"``, and a ``KeyError`` made from that would read ``"\"'k'\""``)."""
    args = exc.args
    return {
        "type": type(exc).__name__,
        "message": args[0] if len(args) == 1 and isinstance(args[0], str) else str(exc),
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
