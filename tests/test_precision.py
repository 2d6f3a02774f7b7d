"""The examples' ``EMBEDDING_PRECISION``: float32, bfloat16 under autocast,
or ``auto`` (bfloat16 on a CPU that multiplies bfloat16 in hardware,
float32 elsewhere), its numbers
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

from example_models.embedding import (  # noqa: E402
    checked_precision,
    cpu_has_bf16,
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
    "precision, device, native_bf16, chosen",
    [
        ("auto", "cpu", True, "bfloat16"),
        ("auto", "cpu:0", True, "bfloat16"),  # a CPU named with an index is a CPU
        ("auto", "cpu", False, "float32"),  # emulated bfloat16 is slower
        ("auto", "cuda:0", True, "float32"),  # a GPU: as given, float32 unless asked
        ("auto", "cuda", False, "float32"),
        ("float32", "cpu", True, "float32"),
        ("bfloat16", "cpu", False, "bfloat16"),
        ("bfloat16", "cuda:1", False, "bfloat16"),
    ],
)
def test_auto_means_bfloat16_only_on_a_cpu_that_multiplies_bfloat16_in_hardware(precision, device, native_bf16, chosen):
    assert resolve_precision(precision, device, native_bf16) == chosen


@pytest.mark.parametrize("bad", ["half", "fp32", "", None, 16])
def test_a_precision_that_is_not_one_of_the_three_is_refused_naming_them(bad):
    with pytest.raises(ValueError, match=r"EMBEDDING_PRECISION must be one of auto, float32, bfloat16, got "):
        checked_precision(bad)
    with pytest.raises(ValueError, match=r"precision must be one of auto, float32, bfloat16"):
        load_sentence_model(precision=bad)


@pytest.mark.skipif(not os.path.exists("/proc/cpuinfo"), reason="reads Linux's /proc/cpuinfo")
def test_native_bfloat16_is_what_the_cpu_says_it_has():
    """AMX tiles or AVX512-BF16, as the kernel lists the CPU's flags: an
    AMD EPYC of this project's CI machines has the second, and computes in
    bfloat16 three times as fast as in float32."""
    with open("/proc/cpuinfo") as info:
        flags = next(line for line in info if line.startswith("flags")).split()
    amx = "amx_bf16" in flags and "amx_tile" in flags
    assert cpu_has_bf16() == (amx or "avx512_bf16" in flags)


def test_auto_loads_the_model_in_the_precision_this_cpu_is_fast_in():
    model = load_sentence_model(precision="auto")
    assert model._example_precision == ("bfloat16" if cpu_has_bf16() else "float32")


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


def test_bfloat16_keeps_linear_weights_in_bfloat16_and_autocasts_numbers():
    """The linear layers' weights are kept in bfloat16, not rounded again
    from float32 for each batch: the same vectors autocast gives over
    float32 weights."""
    import torch

    kept = load_sentence_model(precision="bfloat16")
    linears = [m for m in kept.modules() if isinstance(m, torch.nn.Linear)]
    assert linears and all(m.weight.dtype == torch.bfloat16 for m in linears)
    rounded_each_time = load_sentence_model(precision="float32")
    rounded_each_time._example_precision = "bfloat16"  # autocast over its float32 weights
    assert all(m.weight.dtype == torch.float32 for m in rounded_each_time.modules() if isinstance(m, torch.nn.Linear))
    assert np.abs(embed(kept, TEXTS) - embed(rounded_each_time, TEXTS)).max() < 1e-6


def test_auto_is_the_default_of_both_examples():
    from example_flask.app import DEFAULTS

    assert DEFAULTS["EMBEDDING_PRECISION"] == "auto"
    env = {k: v for k, v in os.environ.items() if k != "EMBEDDING_PRECISION"}
    out = subprocess.run(
        [sys.executable, "-c", "import example_django.settings as s; print(s.EMBEDDING_PRECISION)"],
        cwd=ROOT, env=dict(env, PYTHONPATH=str(ROOT)), capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert out.stdout.strip() == "auto", out.stderr[-2000:]


def test_either_probe_says_so_and_one_missing_or_failing_counts_as_no(monkeypatch):
    import torch

    def fails() -> bool:
        raise RuntimeError("cpuinfo could not be read")

    def has() -> bool:
        return True

    def lacks() -> bool:
        return False

    for amx, avx512 in [(has, lacks), (lacks, has), (fails, has)]:
        monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", amx)
        monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", avx512)
        assert cpu_has_bf16() is True
    for amx, avx512 in [(lacks, lacks), (fails, fails), (fails, lacks)]:
        monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", amx)
        monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", avx512)
        assert cpu_has_bf16() is False
    monkeypatch.delattr(torch.cpu, "_is_amx_tile_supported")
    assert cpu_has_bf16() is False
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", has)
    assert cpu_has_bf16() is True
    monkeypatch.delattr(torch.cpu, "_is_avx512_bf16_supported")
    assert cpu_has_bf16() is False
