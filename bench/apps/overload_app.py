"""The apps ``bench/overload_bench.py`` puts under a retry storm: one
batched route, ``POST /predict`` (``{"n": <request number>}``), on a
simulated device (:mod:`bench.sim`) that records every input it runs.

* Flask: ``gunicorn 'overload_app:flask_app()'``;
* Django: ``gunicorn overload_app:django_application``;
* service_streamer 0.1.2's ``ThreadedStreamer`` in a Flask view, as its
  README shows: ``gunicorn 'overload_app:service_streamer_app()'``.

Imported as a top-level module (``bench/apps`` on ``PYTHONPATH``), so that
the benchmark can serve it with another checkout's ``streamer_core``
(``--library``). Settings from the environment:

=========================  ===========================================
``OVERLOAD_BACKEND``       ``thread``, ``process`` or ``redis``
``OVERLOAD_REDIS_URL``     the Redis server, for ``redis``
``OVERLOAD_PREFIX``        the model's Redis prefix, for ``redis``
``OVERLOAD_RAN_DIR``       where each process appends what it ran
``OVERLOAD_FIXED_MS``      the device's time a batch, ms (100)
``OVERLOAD_PER_ITEM_MS``   and an input, ms (0)
``OVERLOAD_BATCH``         the batch size (8)
``OVERLOAD_SETTINGS``      JSON of more ``STREAMER_*`` settings
=========================  ===========================================
"""

from __future__ import annotations

import json
import os
import threading
import time
from typing import Any, Dict, List, Optional

from bench.sim import simulate_batch

try:  # the streamer_core of the checkout on PYTHONPATH
    from streamer_core import ManagedModel
except ImportError:  # pragma: no cover - service_streamer's app needs none
    ManagedModel = object  # type: ignore[misc, assignment]

BATCH = int(os.environ.get("OVERLOAD_BATCH", "8"))
MAX_LATENCY = 0.01

_log_lock = threading.Lock()


def record(ran_dir: str, batch: List[Any]) -> None:
    """Append the request numbers of a batch that ran, with when it ended."""
    line = f"{time.monotonic():.6f} " + " ".join(str(int(x)) for x in batch) + "\n"
    with _log_lock, open(os.path.join(ran_dir, f"{os.getpid()}.log"), "a") as log:
        log.write(line)


class Device(ManagedModel):  # type: ignore[misc, valid-type]
    """The simulated device, recording what it runs (a worker builds its own)."""

    def init_model(self, ran_dir: str, fixed_ms: float, per_item_ms: float) -> None:  # type: ignore[override]
        self.ran_dir, self.fixed_ms, self.per_item_ms = ran_dir, float(fixed_ms), float(per_item_ms)

    def predict(self, batch: List[Any]) -> List[Any]:
        outputs = simulate_batch(batch, self.fixed_ms, self.per_item_ms)
        record(self.ran_dir, batch)
        return outputs


def device_kwargs() -> Dict[str, Any]:
    return {
        "ran_dir": os.environ["OVERLOAD_RAN_DIR"],
        "fixed_ms": float(os.environ.get("OVERLOAD_FIXED_MS", "100")),
        "per_item_ms": float(os.environ.get("OVERLOAD_PER_ITEM_MS", "0")),
    }


def streamer_settings() -> Dict[str, Any]:
    """The batched route's settings, as ``STREAMER_*`` keys."""
    backend = os.environ.get("OVERLOAD_BACKEND", "thread")
    settings: Dict[str, Any] = {
        "STREAMER_BACKEND": backend,
        "STREAMER_BATCH_SIZE": BATCH,
        "STREAMER_MAX_LATENCY": MAX_LATENCY,
        "STREAMER_TIMEOUT": 20.0,
        "STREAMER_WORKER_NUM": 1,
    }
    if backend == "redis":
        settings["STREAMER_REDIS_URL"] = os.environ["OVERLOAD_REDIS_URL"]
    settings.update(json.loads(os.environ.get("OVERLOAD_SETTINGS", "{}")))
    return settings


def _number(body: Any) -> int:
    return int(body["n"])


def flask_app() -> Any:
    from flask import Flask

    from flask_streamer import FlaskStreamer

    app = Flask("overload")
    app.config.update(streamer_settings())
    route: Dict[str, Any] = {"field": "n", "init_kwargs": device_kwargs()}
    if os.environ.get("OVERLOAD_BACKEND") == "redis":
        route["prefix"] = os.environ["OVERLOAD_PREFIX"]
    FlaskStreamer(app).add_batched_route("/predict", "predict", Device, **route)
    return app


def service_streamer_app() -> Any:
    from flask import Flask, jsonify, request
    from service_streamer import ThreadedStreamer  # type: ignore[import-untyped]

    kwargs = device_kwargs()

    def predict(batch: List[Any]) -> List[Any]:
        outputs = simulate_batch(batch, kwargs["fixed_ms"], kwargs["per_item_ms"])
        record(kwargs["ran_dir"], batch)
        return outputs

    streamer = ThreadedStreamer(predict, BATCH, MAX_LATENCY)
    app = Flask("overload-ss")

    @app.post("/predict")
    def view() -> Any:
        return jsonify(streamer.predict([_number(request.get_json())])[0])

    return app


def _django() -> Optional[Any]:
    """The Django project of one batched view, set up when first asked."""
    import django
    from django.conf import settings

    if not settings.configured:
        streamer: Dict[str, Any] = {key[len("STREAMER_") :]: value for key, value in streamer_settings().items()}
        model = {"MODEL": "overload_app.Device", "INIT_KWARGS": device_kwargs()}
        settings.configure(
            DEBUG=False,
            SECRET_KEY="overload-bench",
            ALLOWED_HOSTS=["*"],
            ROOT_URLCONF="overload_app",
            INSTALLED_APPS=["django_streamer"],
            MIDDLEWARE=["django.middleware.common.CommonMiddleware"],  # a Content-Length, as projects have
            STREAMER={
                **{key: value for key, value in streamer.items() if key not in ("BACKEND",)},
                "BACKEND": streamer["BACKEND"],
                "PREFIX": os.environ.get("OVERLOAD_PREFIX", "overload"),
                "MODELS": {"predict": model},
            },
        )
        django.setup()
    return None


def _urlpatterns() -> List[Any]:
    from django.urls import path

    from django_streamer import BatchedView

    return [path("predict", BatchedView.as_view(model="predict", field="n"))]


def __getattr__(name: str) -> Any:
    """``urlpatterns`` and ``django_application``, made on first use: the
    Flask apps of this module set up no Django."""
    if name == "django_application":
        _django()
        from django.core.wsgi import get_wsgi_application

        return get_wsgi_application()
    if name == "urlpatterns":
        return _urlpatterns()
    raise AttributeError(name)
