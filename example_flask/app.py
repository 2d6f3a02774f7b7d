"""The example's application factory."""

from __future__ import annotations

import threading
from typing import Any, Dict, Optional

from flask import Flask, Request, jsonify, request

from example_models.embedding import (
    DEFAULT_MODEL,
    SentenceEmbedder,
    checked_precision,
    embed,
    load_sentence_model,
    names_of,
    sentence_of,
    show_logs,
)
from example_models.openai_api import METHODS, method_not_allowed, models_reply, serve_embeddings
from example_models.vision import DEFAULT_IMAGE_MODEL, ImageClassifier, image_upload
from flask_streamer import FlaskStreamer, json_error, request_item, request_upload
from flask_streamer.settings import written_as
from streamer_core.errors import ConfigurationError
from streamer_core.options.config import OPTIONS
from streamer_core.web.deadline import TIMEOUT_HEADER, EndpointDeadline, environ_headers
from streamer_core.web.http import dumps_json

DEFAULTS: Dict[str, Any] = {
    "STREAMER_BACKEND": "thread",
    "STREAMER_BATCH_SIZE": 64,
    "STREAMER_MAX_LATENCY": 0.05,
    # Batches of texts of like length, at most 1024 padded tokens each: on
    # mixed-length text, 2.5x the sentences/s of batches by count alone, and
    # short sentences still run about 48 together (bench/cost_bench.py,
    # bench/web_bench.py; the README's Performance section).
    "STREAMER_ITEM_COST": "example_models.embedding:token_estimate",
    "STREAMER_MAX_BATCH_COST": 1024,
    # Every answer is JSON, an unknown path's 404 and a 405 too.
    "STREAMER_JSON_ERRORS": True,
    # Prometheus metrics, liveness and readiness (README: Operations).
    "STREAMER_METRICS_ROUTE": "/metrics",
    "STREAMER_HEALTH_ROUTE": "/healthz",
    "STREAMER_READY_ROUTE": "/readyz",
    "EMBEDDING_MODEL": DEFAULT_MODEL,
    # auto: bfloat16 products on a CPU with AMX or AVX512-BF16 (about 3x float32's speed,
    # every vector within a cosine of 0.9999 of float32's), float32
    # elsewhere; float32 or bfloat16 to choose (example_models.embedding).
    "EMBEDDING_PRECISION": "auto",
    # /classify: EfficientNet-Lite0 on uploaded images. On this project's
    # 2-core CPU, batches of 4 run fastest (56 images/s, against 40 one by
    # one and 34 at 16); on a GPU, raise it to 32 or more.
    "IMAGE_MODEL": DEFAULT_IMAGE_MODEL,
    "CLASSIFY_BATCH_SIZE": 4,
}


def create_app(config: Optional[Dict[str, Any]] = None) -> Flask:
    """The app: defaults, then ``FLASK_*`` environment variables, then ``config``."""
    _show_streamer_logs()
    app = Flask(__name__)
    app.config.update(DEFAULTS)
    app.config.from_prefixed_env()
    app.config.update(config or {})

    # Two batches of each model at once on the thread backend, each with
    # half of torch's threads on a CPU: 14% more requests on 2 cores, where
    # the web process's own work slowed one batch over both (README: the
    # thread backend's model_threads). The process and redis backends run
    # STREAMER_WORKER_NUM processes instead.
    app.config.setdefault("STREAMER_MODEL_THREADS", 2 if app.config["STREAMER_BACKEND"] == "thread" else 1)
    threads = app.config["STREAMER_MODEL_THREADS"]
    try:
        precision = checked_precision(app.config["EMBEDDING_PRECISION"], written_as("EMBEDDING_PRECISION", app.config))
    except ValueError as exc:
        raise ConfigurationError(str(exc)) from None
    streamer = FlaskStreamer()
    streamer.add_batched_route(
        "/stream",
        "stream",
        SentenceEmbedder,
        parse=parse_sentence,
        init_kwargs={"model_name": app.config["EMBEDDING_MODEL"], "precision": precision, "batches_at_once": threads},
    )
    streamer.add_batched_route(
        "/classify",
        "classify",
        ImageClassifier,
        parse=parse_image,
        batch_size=_checked(app, "CLASSIFY_BATCH_SIZE", "batch_size"),
        max_latency=0.01,
        item_cost=None,  # every image is decoded to 224 x 224: batches by count
        max_batch_cost=None,
        init_kwargs={"model_name": app.config["IMAGE_MODEL"], "batches_at_once": threads},
    )
    streamer.init_app(app)

    naive = _NaiveModel(app.config["EMBEDDING_MODEL"], precision)

    @app.post("/naive")
    def naive_view() -> Any:
        """The same model, called once per request: what /stream is compared
        with. Its request is read by the same rules (the body limit, the
        media types, the JSON errors)."""
        try:
            sentence = parse_sentence(request)
            return app.response_class(dumps_json(embed(naive.get(), [sentence])[0]), mimetype="application/json")
        except Exception as exc:
            return json_error(exc, "naive")

    served = names_of(app.config["EMBEDDING_MODEL"])

    def answer(status: int, body: Dict[str, Any], headers: Dict[str, str]) -> Any:
        return app.response_class(dumps_json(body), status, headers, mimetype="application/json")

    # The client's deadline header, read as the app's batched routes read it.
    deadline = EndpointDeadline.checked(
        app.config.get("STREAMER_TIMEOUT_HEADER", TIMEOUT_HEADER),
        app.config.get("STREAMER_ENVOY_TIMEOUT", False),
        "/v1/embeddings",
    )

    @app.route("/v1/embeddings", methods=METHODS)
    def embeddings() -> Any:
        """OpenAI's embeddings API on /stream's model (example_models.openai_api)."""
        if request.method != "POST":
            return answer(*method_not_allowed(request.method, ["POST"]))
        embed = lambda: streamer.get_streamer("stream")  # noqa: E731
        headers = environ_headers(request.environ)
        timed = lambda config: deadline.timeout(headers, config)  # noqa: E731
        return answer(*serve_embeddings(request_item, embed, served, app.logger, app.debug, timed))

    @app.route("/v1/models", methods=METHODS)
    def models() -> Any:
        if request.method not in ("GET", "HEAD"):
            return answer(*method_not_allowed(request.method, ["GET"]))
        return answer(200, models_reply(served[0]), {})

    @app.get("/")
    def index() -> Any:
        return jsonify(
            endpoints={
                "POST /naive": "one model call per request",
                "POST /stream": "batched",
                "POST /v1/embeddings": "OpenAI's embeddings API, batched (openai.OpenAI(base_url=.../v1))",
                "GET /v1/models": "the model served, as OpenAI's API lists models",
                "POST /classify": 'an image, batched: curl -F "file=@cat.jpg" .../classify',
                "GET /metrics": "Prometheus metrics",
                "GET /healthz": "liveness",
                "GET /readyz": "readiness: 200 once the model can serve",
            },
            backend=app.config["STREAMER_BACKEND"],
            model=app.config["EMBEDDING_MODEL"],
            image_model=app.config["IMAGE_MODEL"],
        )

    return app


def _checked(app: Flask, key: str, option: str) -> Any:
    """The example's own setting ``key``, checked as the streamer's option
    ``option`` is, and named as the user wrote it: ``FLASK_<key>`` when it
    came from that environment variable (not as the route keyword it feeds)."""
    try:
        return OPTIONS[option].checked(app.config[key], written_as(key, app.config))
    except (TypeError, ValueError) as exc:
        raise ConfigurationError(str(exc)) from None


def _show_streamer_logs() -> None:
    """Let streamer_core's INFO lines (a model ready, and how long it took to
    load) and the example's own (the precision its model computes in) reach
    the console, under the dev server and gunicorn alike, unless logging is
    set up already."""
    show_logs(("streamer_core", "example_models.embedding"))


def parse_sentence(req: Request) -> str:
    """The sentence of a request: JSON ``{"s": ...}``, the form field ``s``,
    or a text file ``s`` (``curl -F "s=@s.txt"``)."""
    return sentence_of(request_item("s"))


def parse_image(req: Request) -> Any:
    """The image of a request: the uploaded file ``file`` (``curl -F
    "file=@cat.jpg"``), checked by its first bytes here and decoded in
    the batch (``example_models.vision``)."""
    return image_upload(request_upload("file"))


class _NaiveModel:
    """The model in this web process, loaded on first use."""

    def __init__(self, name: str, precision: str) -> None:
        self._name = name
        self._precision = precision
        self._model: Any = None
        self._lock = threading.Lock()

    def get(self) -> Any:
        if self._model is None:
            with self._lock:
                if self._model is None:
                    self._model = load_sentence_model(self._name, precision=self._precision)
        return self._model
