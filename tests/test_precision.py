"""The examples' ``EMBEDDING_PRECISION``: float32, bfloat16 under autocast,
or ``auto`` (bfloat16 on a CPU with AMX, float32 elsewhere), its numbers
against float32's, and a wrong value refused as each framework refuses one."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

if importlib.util.find_spec("sentence_transformers") is None:
    pytest.skip("needs the example's model (the 'example' or 'test' extra)", allow_module_level=True)

from example_flask.embedding import (  # noqa: E402
    checked_precision,
    cpu_has_amx,
    embed,
    load_sentence_model,
    resolve_precision,
)

ROOT = Path(__file__).resolve().parents[1]
TEXTS = [
    "A man is playing a guitar.",
    "Stocks fell sharply today after the report.",
    "x",
    "a much longer sentence about many things " * 12,
]


@pytest.mark.parametrize(
    "precision, device, amx, chosen",
    [
        ("auto", "cpu", True, "bfloat16"),
        ("auto", "cpu", False, "float32"),  # emulated bfloat16 would be slower
        ("auto", "cuda:0", True, "float32"),  # a GPU: as given, float32 unless asked
        ("auto", "cuda", False, "float32"),
        ("float32", "cpu", True, "float32"),
        ("bfloat16", "cpu", False, "bfloat16"),
        ("bfloat16", "cuda:1", False, "bfloat16"),
    ],
)
def test_auto_means_bfloat16_only_on_a_cpu_with_amx(precision, device, amx, chosen):
    assert resolve_precision(precision, device, amx) == chosen


@pytest.mark.parametrize("bad", ["half", "fp32", "", None, 16])
def test_a_precision_that_is_not_one_of_the_three_is_refused_naming_them(bad):
    with pytest.raises(ValueError, match=r"EMBEDDING_PRECISION must be one of auto, float32, bfloat16, got "):
        checked_precision(bad)
    with pytest.raises(ValueError, match=r"precision must be one of auto, float32, bfloat16"):
        load_sentence_model(precision=bad)


@pytest.mark.skipif(not os.path.exists("/proc/cpuinfo"), reason="reads Linux's /proc/cpuinfo")
def test_amx_is_what_the_cpu_says_it_has():
    with open("/proc/cpuinfo") as info:
        flags = next(line for line in info if line.startswith("flags")).split()
    assert cpu_has_amx() == ("amx_bf16" in flags and "amx_tile" in flags)


def test_auto_loads_the_model_in_the_precision_this_cpu_is_fast_in():
    model = load_sentence_model(precision="auto")
    assert model._example_precision == ("bfloat16" if cpu_has_amx() else "float32")


def test_bfloat16_vectors_stay_within_a_cosine_of_0_9999_of_float32s():
    """bfloat16 computes the products in bfloat16 (the vectors differ from
    float32's) and keeps what accumulates in float32 (they differ little):
    what the README promises of it."""
    exact = embed(load_sentence_model(precision="float32"), TEXTS)
    rounded = embed(load_sentence_model(precision="bfloat16"), TEXTS)
    assert rounded.dtype == np.float32 and rounded.shape == exact.shape
    assert np.abs(np.linalg.norm(rounded, axis=1) - 1).max() < 1e-5
    cosines = (rounded * exact).sum(axis=1)
    assert cosines.min() >= 0.9999, cosines
    assert np.abs(rounded - exact).max() > 1e-5, "bfloat16 gave float32's numbers: autocast did not apply"


def test_the_django_example_refuses_to_start_with_a_wrong_precision():
    env = dict(os.environ, PYTHONPATH=str(ROOT), EMBEDDING_PRECISION="half")
    env.pop("DJANGO_SETTINGS_MODULE", None)
    result = subprocess.run(
        [sys.executable, "example_django/manage.py", "check"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode != 0
    assert "ImproperlyConfigured: EMBEDDING_PRECISION must be one of auto, float32, bfloat16, got 'half'" in (
        result.stderr
    )
