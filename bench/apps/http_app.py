"""The Flask app that ``bench/http_bench.py`` puts under load.

Every route parses the request the same way (``flask_streamer``'s own rule:
the JSON body's ``"s"`` key, else the form field ``s``; a bad body is a 400):

==================  ===========================================================
``POST /noop``      parses, returns a constant JSON: the server's own ceiling
``POST /naive``     calls the model once per request (``predict([x])[0]``)
``POST /stream``    ``flask_streamer``'s batched route (thread backend)
``POST /ss_stream`` service_streamer 0.1.2's ``ThreadedStreamer``, used the way
                    its README shows: ``streamer.predict([x])[0]`` in a view
``POST /core_stream`` streamer_core's ``ThreadedStreamer`` in the same kind of
                    view (a diagnostic: the core without the extension)
``GET /info``       the model, its ideal throughput, batch counters per route,
                    the requests in flight
==================  ===========================================================

The model and the batching settings come from the environment, so every
server (Flask's dev server, gevent's ``WSGIServer``, gunicorn) builds the same
app with ``create_app()``:

=============================  ========  =======================================
variable                       default   meaning
=============================  ========  =======================================
``BENCH_HTTP_MODEL``           ``sim``   ``sim`` (the simulated accelerator of
                                         :mod:`bench.sim`), ``minilm`` (the
                                         example's sentence embedder) or
                                         ``zero`` (returns its inputs at once:
                                         the batching path's own cost)
``BENCH_HTTP_BATCH_SIZE``      ``64``
``BENCH_HTTP_MAX_LATENCY``     ``0.1``   seconds, both libraries
``BENCH_HTTP_FIXED_MS``        ``10``    sim: ms per batch
``BENCH_HTTP_PER_ITEM_MS``     ``0.2``   sim: ms per item
``BENCH_HTTP_SERVER``          ``?``     the server's name, echoed by ``/info``
=============================  ========  =======================================

Nothing here patches anything: ``bench/apps/http_server.py`` decides on gevent's
monkey-patching before it imports this module.
"""

from __future__ import annotations

import os
import resource
import statistics
import threading
import time
from typing import Any, Callable, Dict, List, Sequence

from flask import Flask, jsonify, request

from flask_streamer import FlaskStreamer
from flask_streamer.extension import json_body
from streamer_core.web.http import InvalidInput, error_response, item_from_request, to_jsonable

__all__ = ["create_app", "BenchModel", "load_model", "SENTENCE"]

#: What the load generator sends (``{"s": SENTENCE}``) and what MiniLM's
#: batch time is measured on.
SENTENCE = "The quick brown fox jumps over the lazy dog near the bank of the river."

FIELD = "s"


class BenchModel:
    """A batch function and what the benchmark needs to know about it."""

    def __init__(
        self, name: str, predict: Callable[[List[Any]], Sequence[Any]], batch_ms: float, batch_size: int, detail: str
    ) -> None:
        self.name = name
        self.predict = predict
        self.batch_ms = batch_ms  # device time of one full batch; 0 for the zero model
        self.batch_size = batch_size
        self.detail = detail

    @property
    def ideal_rps(self) -> float:
        """Throughput of the model alone, always busy on full batches."""
        return float("inf") if self.batch_ms <= 0 else self.batch_size / (self.batch_ms / 1000.0)


def _env_float(name: str, default: float) -> float:
    return float(os.environ.get(name, default))


def load_model(name: str, batch_size: int) -> BenchModel:
    """The model named ``name``, loaded (and, for MiniLM, timed on a full batch)."""
    if name == "sim":
        from bench import sim

        fixed_ms = _env_float("BENCH_HTTP_FIXED_MS", 10.0)
        per_item_ms = _env_float("BENCH_HTTP_PER_ITEM_MS", 0.2)
        return BenchModel(
            name,
            sim.make_predict(fixed_ms, per_item_ms),
            fixed_ms + per_item_ms * batch_size,
            batch_size,
            f"sleep {fixed_ms:g} ms + {per_item_ms:g} ms/item under a device lock",
        )
    if name == "zero":
        return BenchModel(name, list, 0.0, batch_size, "returns its inputs at once")
    if name == "minilm":
        from example_models.embedding import embed, load_sentence_model

        model = load_sentence_model()

        def predict(batch: List[Any]) -> List[Any]:
            return embed(model, batch)

        full = [SENTENCE] * batch_size
        for _ in range(2):  # warm-up: first calls allocate
            predict(full)
        timings = []
        for _ in range(7):
            started = time.perf_counter()
            predict(full)
            timings.append((time.perf_counter() - started) * 1000.0)
        import torch

        # The fastest call is the model's own time: on a shared machine, noise only adds.
        return BenchModel(
            name,
            predict,
            min(timings),
            batch_size,
            f"all-MiniLM-L6-v2 on {model.device}, torch threads {torch.get_num_threads()}; "
            f"a batch of {batch_size} took {min(timings):.0f} ms at best, median "
            f"{statistics.median(timings):.0f}, worst {max(timings):.0f} (7 calls at start-up)",
        )
    raise ValueError(f"unknown BENCH_HTTP_MODEL {name!r}: sim, minilm or zero")


class _InFlight:
    """WSGI middleware counting the requests being handled, so the benchmark
    can wait until what one run left in flight is done before the next."""

    def __init__(self, wsgi_app: Callable[..., Any]) -> None:
        self.wsgi_app = wsgi_app
        self.count = 0
        self._lock = threading.Lock()

    def __call__(self, environ: Dict[str, Any], start_response: Callable[..., Any]) -> Any:
        with self._lock:
            self.count += 1
        try:
            return self.wsgi_app(environ, start_response)
        finally:
            with self._lock:
                self.count -= 1


class _Counters:
    """Batches and items each route's model saw (read by the benchmark
    through ``/info`` before and after a run: the mean batch size)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.counts: Dict[str, List[int]] = {}

    def wrap(self, route: str, predict: Callable[[List[Any]], Sequence[Any]]) -> Callable[[List[Any]], Sequence[Any]]:
        counts = self.counts.setdefault(route, [0, 0])
        lock = self._lock

        def counted(batch: List[Any]) -> Sequence[Any]:
            outputs = predict(batch)
            with lock:
                counts[0] += 1
                counts[1] += len(batch)
            return outputs

        counted.__name__ = route
        return counted

    def snapshot(self) -> Dict[str, List[int]]:
        with self._lock:
            return {route: list(counts) for route, counts in self.counts.items()}


def _rusage() -> Dict[str, float]:
    """This process's CPU seconds and context switches so far, every thread
    included (those of the dev server's finished per-connection threads too)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return {"utime": usage.ru_utime, "stime": usage.ru_stime, "nvcsw": usage.ru_nvcsw, "nivcsw": usage.ru_nivcsw}


def _parse() -> Any:
    """The request's input, by flask_streamer's rule for ``field="s"``."""
    return item_from_request(json_body(), request.form, FIELD)


def _bad_request(exc: InvalidInput) -> Any:
    status, body, headers = error_response(exc)
    return jsonify(body), status, headers


def create_app() -> Flask:
    """The benchmark app, configured from the environment (see the module doc)."""
    model_name = os.environ.get("BENCH_HTTP_MODEL", "sim")
    batch_size = int(os.environ.get("BENCH_HTTP_BATCH_SIZE", "64"))
    max_latency = _env_float("BENCH_HTTP_MAX_LATENCY", 0.1)
    model = load_model(model_name, batch_size)
    counters = _Counters()

    app = Flask(__name__)
    app.config["STREAMER_BACKEND"] = "thread"
    in_flight = _InFlight(app.wsgi_app)
    app.wsgi_app = in_flight  # type: ignore[method-assign]

    # -- the server's own ceiling: the same parsing, no model ----------------
    @app.post("/noop")
    def noop() -> Any:
        try:
            _parse()
        except InvalidInput as exc:
            return _bad_request(exc)
        return jsonify({"ok": True})

    # -- one model call per request ----------------------------------------------
    naive_predict = counters.wrap("naive", model.predict)

    @app.post("/naive")
    def naive() -> Any:
        try:
            item = _parse()
        except InvalidInput as exc:
            return _bad_request(exc)
        return jsonify(to_jsonable(naive_predict([item])[0]))

    # -- flask_streamer's batched route ------------------------------------------
    streamer = FlaskStreamer(app)
    stream_predict = counters.wrap("stream", model.predict)

    @streamer.batched_route("/stream", field=FIELD, batch_size=batch_size, max_latency=max_latency)
    def stream(batch: List[Any]) -> Sequence[Any]:
        return stream_predict(batch)

    # -- streamer_core's ThreadedStreamer in a plain view (diagnostic: what the
    #    extension adds to the core, the same way /ss_stream uses service_streamer)
    from streamer_core import ThreadedStreamer

    core = ThreadedStreamer(counters.wrap("core_stream", model.predict), batch_size, max_latency)

    @app.post("/core_stream")
    def core_stream() -> Any:
        try:
            item = _parse()
        except InvalidInput as exc:
            return _bad_request(exc)
        return jsonify(to_jsonable(core.predict([item])[0]))

    # -- service_streamer 0.1.2, as its README shows --------------------------------
    ss_available = True
    try:
        from service_streamer import ThreadedStreamer as LegacyThreadedStreamer
    except ImportError:  # the `bench` extra is not installed: the route answers 501
        ss_available = False
    else:
        legacy = LegacyThreadedStreamer(counters.wrap("ss_stream", model.predict), batch_size, max_latency)

    @app.post("/ss_stream")
    def ss_stream() -> Any:
        if not ss_available:
            return jsonify({"error": "service_streamer is not installed"}), 501
        try:
            item = _parse()
        except InvalidInput as exc:
            return _bad_request(exc)
        return jsonify(to_jsonable(legacy.predict([item])[0]))

    @app.get("/info")
    def info() -> Any:
        return jsonify(
            server=os.environ.get("BENCH_HTTP_SERVER", "?"),
            pid=os.getpid(),
            model=model.name,
            model_detail=model.detail,
            batch_size=batch_size,
            max_latency=max_latency,
            batch_ms=model.batch_ms,
            ideal_rps=None if model.batch_ms <= 0 else model.ideal_rps,
            service_streamer=ss_available,
            counts=counters.snapshot(),
            in_flight=in_flight.count - 1,  # this request aside
            rusage=_rusage(),
        )

    with app.app_context():
        streamer.start(app)  # not on the first request: the warm-up then measures nothing odd
    return app
