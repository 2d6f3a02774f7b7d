"""The web layer's own cost per request, the model excluded: a profile.

    .venv/bin/python -m bench.web_profile                  # Flask and Django, about a minute

Each framework's WSGI application is called in this process, one request
after another (no server, no network), with the body the HTTP benchmark
sends (``{"s": "<a 15-word sentence>"}``), against a model that costs
nothing and answers every input with the same 384-float32 embedding (the
example's output; ``--output list`` answers lists of floats instead, as the
example's model did before it returned arrays). Four paths, each timed by
the process's CPU time over ``--requests`` requests, ``--repeat`` times,
interleaved; the medians are shown:

* ``core``: ``streamer.predict([s])[0]`` with no web framework at all: the
  engine's own round trip (a hand-off to the model thread and back);
* ``bare``: a plain view returning a constant body without reading the
  request: the framework's own cost per request;
* ``plain``: a plain view calling the same kind of streamer, as
  service_streamer's README has it: parse the JSON, ``predict([s])[0]``,
  answer with the framework's JSON response;
* ``stream``: the batched route (``@batched_route`` / ``@batched_view``).

``layer`` = ``stream`` - ``bare`` - ``core``: what this project's web layer
adds on top of the framework and the engine. The stages of ``stream`` (wall
time, from wrappers around the layer's own functions): parse (request to
input), submit, wait (for the result: the model thread's turn), respond
(output to response).
"""

from __future__ import annotations

import argparse
import io
import json
import statistics
import sys
import time
import types
from typing import Any, Callable, Dict, List, Optional

import numpy as np

SENTENCE = "The quick brown fox jumps over the lazy dog near the bank of the river."
BODY = json.dumps({"s": SENTENCE}).encode()
VECTOR = np.random.default_rng(0).standard_normal(384).astype(np.float32)


def zero_model(as_list: bool) -> Callable[[List[Any]], List[Any]]:
    output: Any = VECTOR.tolist() if as_list else VECTOR

    def embed(batch: List[Any]) -> List[Any]:
        return [output] * len(batch)

    return embed


def environ(path: str) -> Dict[str, Any]:
    return {
        "REQUEST_METHOD": "POST",
        "PATH_INFO": path,
        "SCRIPT_NAME": "",
        "QUERY_STRING": "",
        "SERVER_NAME": "127.0.0.1",
        "SERVER_PORT": "8000",
        "SERVER_PROTOCOL": "HTTP/1.1",
        "REMOTE_ADDR": "127.0.0.1",
        "CONTENT_TYPE": "application/json",
        "CONTENT_LENGTH": str(len(BODY)),
        "HTTP_HOST": "127.0.0.1:8000",
        "wsgi.version": (1, 0),
        "wsgi.url_scheme": "http",
        "wsgi.errors": sys.stderr,
        "wsgi.multithread": True,
        "wsgi.multiprocess": False,
        "wsgi.run_once": False,
    }


def call(app: Any, base: Dict[str, Any]) -> bytes:
    env = dict(base)
    env["wsgi.input"] = io.BytesIO(BODY)
    status: List[str] = []

    def start_response(code: str, headers: Any, exc_info: Any = None) -> Any:
        status.append(code)
        return None

    chunks = app(env, start_response)
    try:
        body = b"".join(chunks)
    finally:
        close = getattr(chunks, "close", None)
        if close is not None:
            close()
    if not status[0].startswith("200"):
        raise RuntimeError(f"{base['PATH_INFO']} answered {status[0]}: {body[:300]!r}")
    return body


def cpu_per_request(run_one: Callable[[], Any], requests: int) -> float:
    """Microseconds of this process's CPU per request over ``requests``."""
    started = time.process_time()
    for _ in range(requests):
        run_one()
    return (time.process_time() - started) / requests * 1e6


class Stages:
    """Wall time spent in the layer's own steps, by wrapping them in place."""

    def __init__(self) -> None:
        self.seconds: Dict[str, float] = {}
        self.undo: List[Callable[[], None]] = []

    def wrap(self, owner: Any, attribute: str, stage: str) -> None:
        original = getattr(owner, attribute)
        seconds = self.seconds
        seconds.setdefault(stage, 0.0)
        clock = time.perf_counter

        def timed(*args: Any, **kwargs: Any) -> Any:
            started = clock()
            try:
                return original(*args, **kwargs)
            finally:
                seconds[stage] += clock() - started

        setattr(owner, attribute, timed)
        self.undo.append(lambda: setattr(owner, attribute, original))

    def reset(self) -> None:
        for stage in self.seconds:
            self.seconds[stage] = 0.0

    def restore(self) -> None:
        for undo in reversed(self.undo):
            undo()
        self.undo.clear()


def profile(
    framework: str, apps: Dict[str, Any], core: Callable[[], Any], stage_wraps: List[Any], args: Any
) -> Dict[str, Any]:
    result: Dict[str, Any] = {"framework": framework}
    paths: Dict[str, Callable[[], Any]] = {"core": core}
    for name in ("bare", "plain", "stream"):
        app, path = apps[name]
        paths[name] = lambda app=app, base=environ(path): call(app, base)  # noqa: B008 - built once, on purpose
    for run_one in paths.values():  # warm up
        for _ in range(200):
            run_one()
    timings: Dict[str, List[float]] = {name: [] for name in paths}
    for _ in range(args.repeat):  # interleaved, so that the machine's mood spreads over all of them
        for name, run_one in paths.items():
            timings[name].append(cpu_per_request(run_one, args.requests))
    for name, values in timings.items():
        result[name] = statistics.median(values)
    result["layer"] = result["stream"] - result["bare"] - result["core"]
    stages = Stages()
    for owner, attribute, stage in stage_wraps:
        if hasattr(owner, attribute):
            stages.wrap(owner, attribute, stage)
    app, path = apps["timed" if "timed" in apps else "stream"]
    base = environ(path)
    for _ in range(200):
        call(app, base)
    stages.reset()
    started = time.perf_counter()
    for _ in range(args.requests):
        call(app, base)
    total = time.perf_counter() - started
    stages.restore()
    per = {stage: seconds / args.requests * 1e6 for stage, seconds in stages.seconds.items()}
    per["rest (framework, WSGI)"] = total / args.requests * 1e6 - sum(per.values())
    result["stages"] = per
    result["wall"] = total / args.requests * 1e6
    return result


def flask_profile(args: Any) -> Dict[str, Any]:
    from flask import Flask, Response, jsonify, request

    import flask_streamer.serving as serving
    import streamer_core.web.http as http
    from flask_streamer import FlaskStreamer
    from streamer_core import ThreadedStreamer
    from streamer_core.future import BatchFuture
    from streamer_core.streamer import BaseStreamer

    as_list = args.output == "list"
    app = Flask("web_profile")
    app.config["STREAMER_MAX_LATENCY"] = 0.0
    streamer = FlaskStreamer(app)
    streamer.add_batched_route("/stream", "stream", zero_model(as_list), field="s")
    plain_streamer = ThreadedStreamer(zero_model(as_list), 64, 0.0)
    constant = b'{"ok": true}'

    @app.post("/bare")
    def bare() -> Any:
        return Response(constant, mimetype="application/json")

    @app.post("/plain")
    def plain() -> Any:
        sentence = request.get_json()["s"]
        return jsonify(http.to_jsonable(plain_streamer.predict([sentence])[0]))

    core_streamer = ThreadedStreamer(zero_model(as_list), 64, 0.0)
    wraps = [
        (serving, "read_input", "parse"),
        (BaseStreamer, "submit", "submit"),
        (BatchFuture, "result", "wait"),
        (serving, "answer_json", "respond"),
        (serving, "to_jsonable", "respond"),
    ]
    try:
        return profile(
            "flask",
            {"bare": (app, "/bare"), "plain": (app, "/plain"), "stream": (app, "/stream")},
            lambda: core_streamer.predict([SENTENCE])[0],
            wraps,
            args,
        )
    finally:
        streamer.close(app)
        plain_streamer.close()
        core_streamer.close()


def django_profile(args: Any) -> Dict[str, Any]:
    import django
    from django.conf import settings

    as_list = args.output == "list"
    module = types.ModuleType("web_profile_models")
    module.embed = zero_model(as_list)  # type: ignore[attr-defined]
    sys.modules["web_profile_models"] = module
    urls = types.ModuleType("web_profile_urls")
    sys.modules["web_profile_urls"] = urls
    settings.configure(
        DEBUG=False,
        SECRET_KEY="web-profile",
        ALLOWED_HOSTS=["*"],
        ROOT_URLCONF="web_profile_urls",
        INSTALLED_APPS=["django_streamer"],
        MIDDLEWARE=["django.middleware.common.CommonMiddleware"],
        STREAMER={"MAX_LATENCY": 0.0, "MODELS": {"embed": {"MODEL": "web_profile_models.embed"}}},
        DATABASES={},
    )
    django.setup()
    from django.core.handlers.wsgi import WSGIHandler
    from django.http import HttpResponse, JsonResponse
    from django.urls import path
    from django.views.decorators.csrf import csrf_exempt

    import django_streamer.views as views
    import streamer_core.web.http as http
    from django_streamer import batched_view, close_streamers, request_item
    from streamer_core import ThreadedStreamer
    from streamer_core.future import BatchFuture
    from streamer_core.streamer import BaseStreamer

    plain_streamer = ThreadedStreamer(zero_model(as_list), 64, 0.0)
    core_streamer = ThreadedStreamer(zero_model(as_list), 64, 0.0)
    constant = b'{"ok": true}'

    @csrf_exempt
    def bare(request: Any) -> Any:
        return HttpResponse(constant, content_type="application/json")

    @csrf_exempt
    def plain(request: Any) -> Any:
        sentence = json.loads(request.body)["s"]
        return JsonResponse(http.to_jsonable(plain_streamer.predict([sentence])[0]), safe=False)

    @batched_view("embed")
    def stream(request: Any) -> Any:
        return request_item(request, "s")

    # The same view for the stages: its steps looked up at each call, so the
    # wrappers see them (the decorator binds its respond hook once).
    @batched_view("embed", respond=lambda output: views.default_respond(output))
    def timed(request: Any) -> Any:
        return views.request_item(request, "s")

    urls.urlpatterns = [  # type: ignore[attr-defined]
        path("bare", bare),
        path("plain", plain),
        path("stream", stream),
        path("timed", timed),
    ]
    app = WSGIHandler()
    wraps = [
        (views, "request_item", "parse"),
        (BaseStreamer, "submit", "submit"),
        (BatchFuture, "result", "wait"),
        (views, "default_respond", "respond"),
    ]
    try:
        return profile(
            "django",
            {"bare": (app, "/bare"), "plain": (app, "/plain"), "stream": (app, "/stream"), "timed": (app, "/timed")},
            lambda: core_streamer.predict([SENTENCE])[0],
            wraps,
            args,
        )
    finally:
        close_streamers()
        plain_streamer.close()
        core_streamer.close()


def report(results: List[Dict[str, Any]], args: Any) -> str:
    lines = [
        f"CPU µs per request, median of {args.repeat} interleaved timings of {args.requests} requests, "
        f"model output: {args.output}",
        "",
        "| framework | core | bare view | plain view | batched route | layer = route - bare - core |",
        "|---|--:|--:|--:|--:|--:|",
    ]
    for r in results:
        lines.append(
            f"| {r['framework']} | {r['core']:.0f} | {r['bare']:.0f} | {r['plain']:.0f} | {r['stream']:.0f} "
            f"| {r['layer']:.0f} |"
        )
    lines += ["", "Stages of the batched route, wall µs per request:", ""]
    stage_names: List[str] = []
    for r in results:
        for name in r["stages"]:
            if name not in stage_names:
                stage_names.append(name)
    lines.append("| framework | " + " | ".join(stage_names) + " | total |")
    lines.append("|---|" + "--:|" * (len(stage_names) + 1))
    for r in results:
        cells = [f"{r['stages'].get(name, 0.0):.0f}" for name in stage_names]
        lines.append(f"| {r['framework']} | " + " | ".join(cells) + f" | {r['wall']:.0f} |")
    return "\n".join(lines)


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--frameworks", default="flask,django", help="comma-separated: flask, django")
    parser.add_argument("--requests", type=int, default=3000, help="requests per timing (default 3000)")
    parser.add_argument(
        "--repeat", type=int, default=7, help="interleaved timings per path; the median is shown (default 7)"
    )
    parser.add_argument("--output", choices=["array", "list"], default="array", help="the model's output type")
    parser.add_argument("--json", action="store_true", help="print the results as JSON too")
    args = parser.parse_args(argv)
    results = []
    for framework in [f.strip() for f in args.frameworks.split(",") if f.strip()]:
        results.append(flask_profile(args) if framework == "flask" else django_profile(args))
    print(report(results, args))
    if args.json:
        print(json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
