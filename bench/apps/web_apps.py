"""The plain views ``bench/web_bench.py`` compares the examples with:
service_streamer 0.1.2's ``ThreadedStreamer`` (or ours, for a diagnostic) in a
view written the way its README shows, serving the examples' model.

* Flask: ``gunicorn 'bench.apps.web_apps:flask_app()'``, ``POST /stream``:
  ``jsonify(streamer.predict([s])[0])``;
* Django: ``gunicorn bench.apps.web_apps:django_application``, ``POST /stream``:
  ``JsonResponse(streamer.predict([s])[0], safe=False)``;
* images: ``gunicorn 'bench.apps.web_apps:flask_classify_app()'``, ``POST
  /classify``, the examples' EfficientNet-Lite0 on an uploaded file.

The model is the examples' all-MiniLM-L6-v2, answering lists of floats
(``tolist()``: what a view that hands the output to ``jsonify`` or
``JsonResponse`` needs). ``BENCH_WEB_STREAMER=core`` puts streamer_core's
``ThreadedStreamer`` in the same view instead of service_streamer's.

For ``bench/scale_bench.py``, ``BENCH_WEB_KIND`` picks service_streamer's
counterpart of each of our backends in the Flask view: ``thread`` (the
default, its ``ThreadedStreamer``), ``process`` (its ``Streamer``:
``BENCH_WEB_WORKERS`` spawned workers per web process, on
``BENCH_WEB_DEVICES``), ``redis`` (its ``RedisStreamer`` on
``BENCH_WEB_REDIS``, host:port, prefix ``BENCH_WEB_PREFIX``; its workers
run by ``python -m bench.apps.ss_workers``).
"""

from __future__ import annotations

import json
import os
from typing import Any, List

BATCH_SIZE = 64
MAX_LATENCY = 0.1


def _streamer() -> Any:
    kind = os.environ.get("BENCH_WEB_KIND", "thread")
    if kind == "process":
        from service_streamer import Streamer  # type: ignore[import-untyped]

        from bench.apps.cost_models import LegacyListEmbedder

        devices = [int(d) for d in os.environ.get("BENCH_WEB_DEVICES", "").split(",") if d.strip()] or None
        workers = int(os.environ.get("BENCH_WEB_WORKERS", "1"))
        return Streamer(LegacyListEmbedder, BATCH_SIZE, MAX_LATENCY, worker_num=workers, cuda_devices=devices)
    if kind == "redis":
        from service_streamer import RedisStreamer

        return RedisStreamer(os.environ["BENCH_WEB_REDIS"], prefix=os.environ.get("BENCH_WEB_PREFIX", ""))
    from example_models.embedding import embed, load_sentence_model

    model = load_sentence_model(precision=os.environ.get("EMBEDDING_PRECISION", "auto"))

    def predict(batch: List[str]) -> List[List[float]]:
        result: List[List[float]] = embed(model, batch).tolist()
        return result

    predict(["warm up"] * 8)
    if os.environ.get("BENCH_WEB_STREAMER") == "core":
        from streamer_core import ThreadedStreamer
    else:
        from service_streamer import ThreadedStreamer  # type: ignore[import-untyped, no-redef]
    return ThreadedStreamer(predict, BATCH_SIZE, MAX_LATENCY)


def flask_app() -> Any:
    from flask import Flask, jsonify, request

    app = Flask("bench_web_plain")
    streamer = _streamer()

    @app.post("/stream")
    def stream() -> Any:
        return jsonify(streamer.predict([request.get_json()["s"]])[0])

    return app


def flask_classify_app() -> Any:
    """service_streamer's own tutorial, on the examples' image model: an
    upload in the field ``file`` at ``POST /classify``, decoded in the view
    as the examples do, ``jsonify(streamer.predict([image])[0])``, batches
    of ``CLASSIFY_BATCH_SIZE`` (the examples' setting) within 10 ms."""
    from flask import Flask, jsonify, request

    from example_flask.app import DEFAULTS
    from example_models.vision import classify, decode_image, load_image_model

    model = load_image_model()

    def predict(batch: List[Any]) -> List[Any]:
        return classify(model, batch)

    import numpy

    predict([numpy.zeros((3, 224, 224), dtype=numpy.float32)] * 2)
    if os.environ.get("BENCH_WEB_STREAMER") == "core":
        from streamer_core import ThreadedStreamer
    else:
        from service_streamer import ThreadedStreamer  # type: ignore[import-untyped, no-redef]
    streamer = ThreadedStreamer(predict, DEFAULTS["CLASSIFY_BATCH_SIZE"], 0.01)
    app = Flask("bench_web_plain_classify")

    @app.post("/classify")
    def classify_view() -> Any:
        return jsonify(streamer.predict([decode_image(request.files["file"].read())])[0])

    return app


def _django() -> Any:
    import django
    from django.conf import settings

    settings.configure(
        DEBUG=False,
        SECRET_KEY="bench-web-plain",
        ALLOWED_HOSTS=["*"],
        ROOT_URLCONF=__name__,
        # The example project's middleware: the same project, another view.
        MIDDLEWARE=[
            "django.middleware.security.SecurityMiddleware",
            "django.middleware.common.CommonMiddleware",
            "django.middleware.csrf.CsrfViewMiddleware",
        ],
        DATABASES={},
    )
    django.setup()
    from django.core.wsgi import get_wsgi_application
    from django.http import JsonResponse
    from django.urls import path
    from django.views.decorators.csrf import csrf_exempt

    streamer = _streamer()

    @csrf_exempt
    def stream(request: Any) -> Any:
        return JsonResponse(streamer.predict([json.loads(request.body)["s"]])[0], safe=False)

    globals()["urlpatterns"] = [path("stream", stream)]
    return get_wsgi_application()


def __getattr__(name: str) -> Any:  # gunicorn bench.apps.web_apps:django_application
    if name == "django_application":
        application = _django()
        globals()[name] = application
        return application
    raise AttributeError(name)
