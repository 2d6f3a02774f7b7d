"""Both examples on CUDA, as users run them (gunicorn with the examples'
configs, the thread backend, which loads the model on CUDA where there is
one): the embeddings are the CPU's within 1e-3 cosine distance, and the
image classifier names the test photos as it does on the CPU."""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, Dict, Iterator, List

import pytest

from tests.servers import free_port

ROOT = Path(__file__).resolve().parents[2]
SENTENCES = [
    "The cat sat on the mat.",
    "A GPU runs a batch of sentences in a few milliseconds.",
    "Happy birthday to you.",
]


def post(url: str, body: bytes, content_type: str, timeout: float = 60.0) -> Any:
    request = urllib.request.Request(url, data=body, headers={"Content-Type": content_type}, method="POST")
    with urllib.request.urlopen(request, timeout=timeout) as response:
        return json.loads(response.read())


def serve(command: List[str], port: int, env: Dict[str, str], log: Path) -> Iterator[str]:
    """A server started by ``command``, until it answers /stream (its models
    loaded); its base URL. What it prints goes to ``log``."""
    with open(log, "wb") as output:
        server = subprocess.Popen(
            command, cwd=ROOT, env={**os.environ, **env, "BIND": f"127.0.0.1:{port}", "PIN_WORKERS": "0"},
            stdout=output, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 300
        while True:
            assert server.poll() is None, f"the server exited:\n{log.read_text(errors='replace')[-3000:]}"
            try:
                post(base + "/stream", json.dumps({"s": "warm up"}).encode(), "application/json", timeout=30)
                break
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                assert time.monotonic() < deadline, "the server did not answer within 300 s"
                time.sleep(1)
        yield base
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait(10)


@pytest.fixture(scope="module")
def flask_example(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    command = [sys.executable, "-m", "gunicorn", "-c", "example_flask/gunicorn.conf.py", "example_flask:create_app()"]
    log = tmp_path_factory.mktemp("flask") / "server.log"
    yield from serve(command, free_port(), {"FLASK_STREAMER_BACKEND": "thread"}, log)


@pytest.fixture(scope="module")
def django_example(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    command = [sys.executable, "-m", "gunicorn", "-c", "example_django/gunicorn.conf.py", "example_django.wsgi"]
    log = tmp_path_factory.mktemp("django") / "server.log"
    yield from serve(command, free_port(), {"STREAMER_BACKEND": "thread"}, log)


@pytest.fixture(scope="module")
def cpu_embeddings() -> Any:
    from example_models.embedding import embed, load_sentence_model

    return embed(load_sentence_model(device="cpu"), SENTENCES)


@pytest.mark.parametrize("example", ["flask_example", "django_example"])
def test_embeddings_on_cuda_are_the_cpus(example: str, cpu_embeddings: Any, request: pytest.FixtureRequest) -> None:
    import numpy as np

    base = request.getfixturevalue(example)
    for sentence, expected in zip(SENTENCES, cpu_embeddings):
        got = np.asarray(post(base + "/stream", json.dumps({"s": sentence}).encode(), "application/json"))
        assert got.shape == (384,)
        distance = 1.0 - float(np.dot(got, expected) / (np.linalg.norm(got) * np.linalg.norm(expected)))
        assert distance < 1e-3, f"{example}: {sentence!r} is {distance:.2e} away from the CPU's embedding"


def test_the_model_is_on_cuda() -> None:
    from example_models.embedding import load_sentence_model
    from example_models.vision import load_image_model

    assert next(load_sentence_model().parameters()).device.type == "cuda"
    assert next(load_image_model().parameters()).device.type == "cuda"


def test_auto_is_float32_on_cuda_and_bfloat16_computes_in_bfloat16_there() -> None:
    """EMBEDDING_PRECISION on a GPU: ``auto`` keeps float32 (bfloat16 only
    for a CPU with AMX or AVX512-BF16); ``bfloat16`` runs the products in bfloat16 under
    autocast on CUDA (the vectors move, within a cosine of 0.9999)."""
    import numpy as np

    from example_models.embedding import embed, load_sentence_model

    auto = load_sentence_model(precision="auto")
    assert auto._example_precision == "float32"
    exact = embed(auto, SENTENCES)
    rounded = embed(load_sentence_model(precision="bfloat16"), SENTENCES)
    assert np.abs(rounded - exact).max() > 1e-5, "bfloat16 gave float32's numbers: autocast did not apply on CUDA"
    assert (rounded * exact).sum(axis=1).min() >= 0.9999


def photo(name: str, kind: str = "JPEG") -> bytes:
    import skimage.data
    from PIL import Image

    buffer = io.BytesIO()
    Image.fromarray(getattr(skimage.data, name)()).save(buffer, kind)
    return buffer.getvalue()


def upload(data: bytes) -> Dict[str, Any]:
    boundary = "streamer-gpu-test"
    body = (
        (
            f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="photo"\r\n'
            f"Content-Type: application/octet-stream\r\n\r\n"
        ).encode()
        + data
        + f"\r\n--{boundary}--\r\n".encode()
    )
    return {"body": body, "content_type": f"multipart/form-data; boundary={boundary}"}


@pytest.mark.parametrize("example", ["flask_example", "django_example"])
@pytest.mark.parametrize("name, kind", [("chelsea", "JPEG"), ("coffee", "PNG")])
def test_photos_are_named_on_cuda_as_on_the_cpu(
    example: str, name: str, kind: str, request: pytest.FixtureRequest
) -> None:
    from example_models.vision import classify, decode_image, load_image_model

    data = photo(name, kind)
    [expected] = classify(load_image_model(device="cpu"), [decode_image(data)])
    base = request.getfixturevalue(example)
    got = post(base + "/classify", **upload(data))
    assert got["class_index"] == expected["class_index"], (got, expected)
    top5 = {entry["class_index"] for entry in got["top5"]}
    assert len(top5 & {entry["class_index"] for entry in expected["top5"]}) >= 4, (got["top5"], expected["top5"])


def test_jpegs_are_decoded_by_the_gpu_and_named_as_on_the_cpu() -> None:
    """On CUDA with torchvision, ``decode_batch`` decodes whole JPEGs with
    nvJPEG and preprocesses them on the GPU; the classes are the Pillow
    path's. A cut JPEG goes to Pillow, whose error names it; a PNG too."""
    import torch

    from example_models.vision import (
        classify,
        decode_batch,
        decode_image,
        gpu_jpeg_decoder,
        load_image_model,
        to_model_input,
    )
    from streamer_core.errors import InvalidInput

    decode_jpeg = gpu_jpeg_decoder()
    if decode_jpeg is None:
        pytest.skip("torchvision is not installed (or not built for this torch): JPEGs decode with Pillow on CUDA too")
    from torchvision.io import ImageReadMode

    cuda = torch.device("cuda")
    cat, coffee, png = photo("chelsea"), photo("coffee"), photo("coffee", "PNG")
    batch = decode_batch([cat, coffee, png], cuda)
    assert batch.device.type == "cuda" and batch.shape == (3, 3, 224, 224)
    # The JPEGs took nvJPEG's way: what decode_jpeg and to_model_input give.
    [direct] = decode_jpeg([torch.frombuffer(bytearray(cat), dtype=torch.uint8)], mode=ImageReadMode.RGB, device=cuda)
    assert torch.allclose(batch[0], to_model_input(direct), atol=1e-5)
    assert torch.allclose(batch[2].cpu(), torch.from_numpy(decode_image(png)))  # the PNG, Pillow's
    got = classify(load_image_model(device="cuda"), [cat, coffee])
    expected = classify(load_image_model(device="cpu"), [decode_image(cat), decode_image(coffee)])
    for g, e in zip(got, expected):
        assert g["class_index"] == e["class_index"], (g, e)
        assert len({x["class_index"] for x in g["top5"]} & {x["class_index"] for x in e["top5"]}) >= 4
    with pytest.raises(InvalidInput, match="could not be decoded"):
        decode_batch([cat, cat[:2000]], cuda)
