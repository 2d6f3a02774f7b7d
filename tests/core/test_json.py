"""The JSON the web layers answer with (``streamer_core.web.http.dumps_json``)
and read (``loads_json``): with orjson, arrays and tensors are written as
they are, and every answer decodes to the values the standard library's
path (``to_jsonable`` + ``json.dumps``) gave; without orjson, that path."""

from __future__ import annotations

import decimal
import json
from typing import Any, Iterator

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import streamer_core.web.http as http
from streamer_core.web.http import dumps_json, loads_json, to_jsonable

torch = pytest.importorskip("torch")


@pytest.fixture(params=["orjson", "stdlib"])
def json_path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """Each test runs with orjson and with the standard library in its place."""
    if request.param == "orjson":
        pytest.importorskip("orjson")
    else:
        monkeypatch.setattr(http, "_orjson", None)
    yield request.param


def todays(value: Any) -> Any:
    """What the layers answered before orjson: to_jsonable, then json."""
    return json.loads(json.dumps(to_jsonable(value)))


RNG = np.random.default_rng(7)
OUTPUTS = {
    "float32 embedding": RNG.standard_normal(384).astype(np.float32),
    "float64 matrix": RNG.standard_normal((3, 4)),
    "ints": np.arange(-5, 5, dtype=np.int64),
    "uint8 image row": np.arange(0, 250, 10, dtype=np.uint8),
    "bools": np.array([True, False]),
    "float16": np.array([0.5, 1.25], dtype=np.float16),
    "not contiguous": np.arange(12, dtype=np.float32).reshape(3, 4)[:, 1],
    "numpy scalars": {"score": np.float32(0.75), "index": np.int64(281), "ok": np.bool_(True)},
    "tensor": torch.tensor([0.1, 0.2, 0.3], requires_grad=True),
    "bfloat16 tensor": torch.tensor([1.5, -2.0], dtype=torch.bfloat16),
    "int tensor": torch.arange(4),
    "nested": {"top5": [(3, "cat", np.float32(0.5))], 7: ["int key"], "v": np.ones(2, dtype=np.float32)},
    "plain": [1, "two", None, True, 2.5, {"a": [1, 2]}],
    # orjson takes integers of 64 bits only: these go by the standard library.
    "big ints": {"id": 2**70, "low": -(2**64), "v": np.ones(2, dtype=np.float32)},
}


@pytest.mark.parametrize("name", sorted(OUTPUTS))
def test_every_answer_decodes_to_todays_values(json_path: str, name: str) -> None:
    value = OUTPUTS[name]
    body = dumps_json(value)
    assert isinstance(body, bytes)
    decoded, expected = json.loads(body), todays(value)
    if isinstance(value, np.ndarray) and value.dtype in (np.float32, np.float16):
        # Shortest text of each float32: it reads back as the same float32,
        # where tolist() wrote the float64 it widens to.
        assert np.array_equal(np.asarray(decoded, dtype=value.dtype), value)
        assert np.allclose(decoded, expected, rtol=1e-6)
    elif name in ("tensor", "numpy scalars", "nested", "big ints"):
        assert _close(decoded, expected)  # float32 values: as float32, equal
    else:
        assert decoded == expected


def _close(a: Any, b: Any) -> bool:
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_close(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_close(x, y) for x, y in zip(a, b))
    if isinstance(a, float) or isinstance(b, float):
        return bool(np.float32(a) == np.float32(b))
    return bool(a == b)


@settings(max_examples=60, deadline=None)
@given(
    hnp.arrays(
        np.float32,
        hnp.array_shapes(min_dims=1, max_dims=2, max_side=16),
        elements=st.floats(width=32, allow_nan=False, allow_infinity=False),
    )
)
def test_float32_arrays_read_back_exactly(array: np.ndarray) -> None:
    decoded = np.asarray(json.loads(dumps_json(array)), dtype=np.float32).reshape(array.shape)
    assert np.array_equal(decoded, array)


def test_decimal_and_what_has_no_json_form(json_path: str) -> None:
    assert json.loads(dumps_json({"d": decimal.Decimal("1.50")})) == {"d": "1.50"}
    assert json.loads(dumps_json([2**70, decimal.Decimal("2")])) == [2**70, "2"]
    with pytest.raises((TypeError, ValueError)):
        dumps_json({1, 2})
    with pytest.raises((TypeError, ValueError)):
        dumps_json([2**70, {1, 2}])


def test_nan_is_null_with_orjson() -> None:
    """JSON has no NaN: orjson writes null, where the standard library writes
    a NaN token that strict parsers (JavaScript's JSON.parse) refuse."""
    pytest.importorskip("orjson")
    assert json.loads(dumps_json(np.array([1.0, np.nan, np.inf], dtype=np.float32))) == [1.0, None, None]


def test_reading_bodies(json_path: str) -> None:
    assert loads_json(b'{"s": "caf\\u00e9", "n": [1, 2.5]}') == {"s": "café", "n": [1, 2.5]}
    for bad in [b"{", b"", b"[1,]", b"\xff"]:
        with pytest.raises(ValueError):
            loads_json(bad)
    with pytest.raises(ValueError):  # never RecursionError
        loads_json(b"[" * 100_000 + b"]" * 100_000)
