"""The examples' ``EMBEDDING_PRECISION``: float32, bfloat16 under autocast,
or ``auto`` (bfloat16 on a CPU with AMX, float32 elsewhere), its numbers
against float32's, and a wrong value refused as each framework refuses one."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

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


def test_without_torchs_amx_probe_or_when_it_fails_there_is_no_amx(monkeypatch):
    import torch

    def fails() -> bool:
        raise RuntimeError("cpuinfo could not be read")

    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", fails)
    assert cpu_has_amx() is False
    monkeypatch.delattr(torch.cpu, "_is_amx_tile_supported")
    assert cpu_has_amx() is False


def test_a_model_not_loaded_by_the_example_computes_in_float32():
    """embed() on a SentenceTransformer made elsewhere: its own numbers."""
    from sentence_transformers import SentenceTransformer

    from example_flask.embedding import resolve_model

    model = SentenceTransformer(resolve_model("all-MiniLM-L6-v2"), device="cpu")
    expected = model.encode(TEXTS, batch_size=len(TEXTS), normalize_embeddings=True, show_progress_bar=False)
    assert np.abs(embed(model, TEXTS) - expected).max() < 1e-5


def test_bfloat16_applies_on_the_slow_tokenizers_path_too():
    """A model whose tokenizer is not a fast one is called through its own
    encode, under the same autocast."""
    exact = embed(load_sentence_model(precision="float32"), TEXTS)
    model = load_sentence_model(precision="bfloat16")
    embed(model, TEXTS[:1])  # makes the encoder
    model._example_encoder.tokenizer = None  # as for a slow tokenizer
    rounded = embed(model, TEXTS)
    assert 1e-5 < np.abs(rounded - exact).max() and (rounded * exact).sum(axis=1).min() >= 0.9999


def test_autocast_follows_the_models_device(monkeypatch):
    """The products run in bfloat16 on the device the model is on (the CPU
    here; ``cuda`` on a GPU: tests/gpu checks the numbers there)."""
    import torch

    seen = []
    real = torch.autocast

    def recording(device_type: str, *args: Any, **kwargs: Any) -> Any:
        seen.append((device_type, kwargs.get("enabled", True)))
        return real(device_type, *args, **kwargs)

    model = load_sentence_model(precision="bfloat16", device="cpu")
    monkeypatch.setattr(torch, "autocast", recording)
    embed(model, TEXTS[:2])
    assert seen and all(entry == (model.device.type, True) for entry in seen), seen
