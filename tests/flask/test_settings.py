"""The ``STREAMER_*`` settings: documented defaults, checks at ``init_app``
with messages that say how to fix each wrong value, per-route overrides,
``FLASK_*`` environment variables, and the application-factory pattern."""

from __future__ import annotations

import ast
import os
import re
import threading
import time
from pathlib import Path

import pytest
from flask import Flask

import flask_streamer.settings
from flask_streamer import DEFAULTS, ConfigurationError, FlaskStreamer
from flask_streamer.settings import APP_DEFAULTS, APP_OPTIONS
from streamer_core import ThreadedStreamer
from streamer_core.options.config import OPTIONS
from tests.flask.apps import double, sized, text_cost, with_batch
from tests.flask.conftest import error_of, queue_behind_hold, spec_of

#: The settings the issue asks for, each with a default and a per-route override.
ISSUE_SETTINGS = [
    "STREAMER_BACKEND",
    "STREAMER_BATCH_SIZE",
    "STREAMER_MAX_LATENCY",
    "STREAMER_WORKER_NUM",
    "STREAMER_CUDA_DEVICES",
    "STREAMER_REDIS_URL",
    "STREAMER_PREFIX",
    "STREAMER_TIMEOUT",
    "STREAMER_MAX_QUEUE",
]


def documented_defaults() -> dict:
    """The settings table of :mod:`flask_streamer.settings`, as ``{setting: default text}``."""
    rows = re.findall(r"^``(STREAMER_\w+)``\s+``(.+?)``\s", flask_streamer.settings.__doc__, re.MULTILINE)
    return dict(rows)


def test_every_setting_has_a_documented_default_that_is_the_real_one():
    documented = documented_defaults()
    for name in ISSUE_SETTINGS:
        assert name in documented, f"{name} is not in the settings table"
    every = {**DEFAULTS, **APP_DEFAULTS, **{field: OPTIONS[field].default for field in APP_OPTIONS}}
    assert set(documented) == {f"STREAMER_{field.upper()}" for field in every}, "table and defaults disagree"
    for field, default in every.items():
        text = documented[f"STREAMER_{field.upper()}"]
        if field == "prefix":
            assert default is None and text == "app.name", "the prefix defaults to the app's name"
        else:
            name = f"STREAMER_{field.upper()}"
            assert ast.literal_eval(text) == default, f"{name} is documented as {text}, but defaults to {default!r}"


def test_an_app_without_settings_runs_with_the_defaults(make_app):
    app, streamer = make_app()
    streamer.add_batched_route("/sized", model=sized)
    spec = spec_of(app, "sized")
    assert (spec.backend, spec.config.batch_size, spec.config.max_latency, spec.worker_num) == ("thread", 64, 0.1, 1)
    assert (spec.cuda_devices, spec.redis_url, spec.config.timeout, spec.config.max_queue) == (None, None, 20.0, None)
    assert spec.prefix == f"{app.name}:sized", "keys are named after the app, then the route"
    response = app.test_client().post("/sized", json=3)
    assert response.status_code == 200 and response.get_json() == {"x": 3, "n": 1}
    running = streamer.get_streamer("sized", app)
    assert isinstance(running, ThreadedStreamer)
    assert (running.config.batch_size, running.config.max_latency, running.config.timeout) == (64, 0.1, 20.0)
    assert running.config.max_queue is None


@pytest.mark.parametrize(
    "config, setting, hint",
    [
        ({"STREAMER_BATCH_SIZE": 0}, "STREAMER_BATCH_SIZE", "whole number >= 1, got 0"),
        ({"STREAMER_BATCH_SIZE": "x"}, "STREAMER_BATCH_SIZE", "whole number >= 1, got 'x'"),
        ({"STREAMER_BATCH_SIZE": True}, "STREAMER_BATCH_SIZE", "whole number >= 1"),
        ({"STREAMER_BACKEND": "gpu"}, "STREAMER_BACKEND", "use one of 'thread', 'process', 'redis'"),
        ({"STREAMER_MAX_LATENCY": -1}, "STREAMER_MAX_LATENCY", "in seconds and must be a finite number >= 0"),
        ({"STREAMER_MAX_LATENCY": float("inf")}, "STREAMER_MAX_LATENCY", "finite number"),
        ({"STREAMER_WORKER_NUM": 0}, "STREAMER_WORKER_NUM", "whole number >= 1"),
        ({"STREAMER_WORKER_NUM": 1.5}, "STREAMER_WORKER_NUM", "whole number >= 1"),
        ({"STREAMER_CUDA_DEVICES": [-1]}, "STREAMER_CUDA_DEVICES", "device indexes start at 0"),
        ({"STREAMER_CUDA_DEVICES": []}, "STREAMER_CUDA_DEVICES", "at least one device"),
        ({"STREAMER_CUDA_DEVICES": True}, "STREAMER_CUDA_DEVICES", "a device index such as 0, a list of them"),
        ({"STREAMER_CUDA_DEVICES": 1.0}, "STREAMER_CUDA_DEVICES", "a device index such as 0, a list of them"),
        ({"STREAMER_CUDA_DEVICES": [0.5]}, "STREAMER_CUDA_DEVICES", "int index"),
        ({"STREAMER_BACKEND": "redis"}, "STREAMER_REDIS_URL", "must be set for the redis backend"),
        (
            {"STREAMER_BACKEND": "redis", "STREAMER_REDIS_URL": "nowhere"},
            "STREAMER_REDIS_URL",
            "a redis://, rediss:// or unix:// URL",
        ),
        (
            {"STREAMER_BACKEND": "redis", "STREAMER_REDIS_URL": "redis+sentinel://127.0.0.1:26379"},
            "STREAMER_REDIS_URL",
            "must name the service",
        ),
        ({"STREAMER_PREFIX": ["a"]}, "STREAMER_PREFIX", "must be a string"),
        ({"STREAMER_TIMEOUT": 0}, "STREAMER_TIMEOUT", "finite number > 0"),
        ({"STREAMER_TIMEOUT": "20"}, "STREAMER_TIMEOUT", "in seconds"),
        ({"STREAMER_TIMEOUT": 86_401}, "STREAMER_TIMEOUT", "at most 86400"),
        ({"STREAMER_MAX_QUEUE": 0}, "STREAMER_MAX_QUEUE", "or None for no limit"),
        ({"STREAMER_CODEC": "json"}, "STREAMER_CODEC", "'msgpack' or 'pickle'"),
        ({"STREAMER_ITEM_COST": "tests.flask.apps:nothing"}, "STREAMER_ITEM_COST", "does not import"),
        ({"STREAMER_ITEM_COST": 12}, "STREAMER_ITEM_COST", "must be a function of one input"),
        ({"STREAMER_MAX_BATCH_COST": 0}, "STREAMER_MAX_BATCH_COST", "finite number > 0"),
        ({"STREAMER_MAX_BATCH_COST": "1024"}, "STREAMER_MAX_BATCH_COST", "finite number > 0"),
        ({"STREAMER_BATCH_COST": "mean"}, "STREAMER_BATCH_COST", "'max' (length times the costliest input"),
        ({"STREAMER_MODEL_THREADS": 0}, "STREAMER_MODEL_THREADS", "whole number >= 1"),
        (
            {"STREAMER_BACKEND": "process", "STREAMER_MODEL_THREADS": 2},
            "STREAMER_MODEL_THREADS",
            "the process backend runs STREAMER_WORKER_NUM worker processes instead",
        ),
    ],
)
def test_a_bad_setting_fails_init_app_naming_it_and_the_fix(make_app, config, setting, hint):
    app, streamer = make_app(config, init=False)
    streamer.add_batched_route("/double", model=double)
    with pytest.raises(ConfigurationError) as info:
        streamer.init_app(app)
    message = str(info.value)
    assert setting in message and hint in message, message
    assert isinstance(info.value, ValueError)
    assert "streamer" not in app.extensions, "a failed init_app must not leave the extension half set up"
    assert "double" not in app.view_functions


def test_a_negative_device_in_the_string_form_is_refused_like_in_the_list_form(make_app):
    """``"0,1"`` is how an environment variable (or ``--devices``) gives
    devices; ``"0,-1"`` holds the index -1 just as ``[0, -1]`` does, and
    must be refused the same way rather than taken for a GPU UUID ``"-1"``."""
    for devices in ([0, -1], "0,-1"):
        app, streamer = make_app({"STREAMER_CUDA_DEVICES": devices}, init=False)
        with pytest.raises(ConfigurationError, match="STREAMER_CUDA_DEVICES holds -1: device indexes start at 0"):
            streamer.init_app(app)


def test_every_wrong_setting_is_reported_at_once(make_app):
    app, streamer = make_app({"STREAMER_BATCH_SIZE": 0, "STREAMER_TIMEOUT": -2, "STREAMER_BACKEND": "gpu"}, init=False)
    with pytest.raises(ConfigurationError) as info:
        streamer.init_app(app)
    for setting in ("STREAMER_BATCH_SIZE", "STREAMER_TIMEOUT", "STREAMER_BACKEND"):
        assert setting in str(info.value)


def test_operations_routes_that_would_hide_a_route_are_refused(make_app):
    """Two operations routes on one path, or one on a path the app serves
    to GET already: werkzeug would serve one of the two, and the other
    would be gone without a word."""
    app, streamer = make_app({"STREAMER_METRICS_ROUTE": "/hello"}, init=False)
    app.add_url_rule("/hello", "hello", lambda: "hi")
    with pytest.raises(ConfigurationError, match=r"STREAMER_METRICS_ROUTE is '/hello', which the app serves already"):
        streamer.init_app(app)
    assert app.test_client().get("/hello").get_data(as_text=True) == "hi"
    app, streamer = make_app({"STREAMER_HEALTH_ROUTE": "/x", "STREAMER_READY_ROUTE": "/x"}, init=False)
    with pytest.raises(ConfigurationError, match=r"STREAMER_READY_ROUTE and STREAMER_HEALTH_ROUTE are both '/x'"):
        streamer.init_app(app)
    app, streamer = make_app({"STREAMER_METRICS_ROUTE": "/metrics", "STREAMER_HEALTH_ROUTE": "/healthz"}, init=False)
    app.add_url_rule("/metrics", "upload_metrics", lambda: "ok", methods=["POST"])  # POST only: no clash
    streamer.init_app(app)
    assert app.test_client().get("/healthz").status_code == 200


def test_a_model_spawned_workers_cannot_import_is_refused_at_init_app(make_app):
    """On the process backend a nested function cannot reach a worker: every
    request got a 503 with Retry-After, which no retry could help. It is a
    wrong setting, said before the app serves; the thread backend takes it."""

    def nested(batch):
        return batch

    app, streamer = make_app({"STREAMER_BACKEND": "process"}, init=False)
    streamer.add_batched_route("/nested", "nested", nested)
    with pytest.raises(ConfigurationError, match=r"is a lambda or is defined inside a function; the process backend"):
        streamer.init_app(app)
    app, streamer = make_app(init=False)
    streamer.add_batched_route("/nested", "nested", nested)
    streamer.init_app(app)
    assert app.test_client().post("/nested", json=1).get_json() == 1


def test_a_misspelt_setting_is_refused_with_a_did_you_mean(make_app):
    app, streamer = make_app({"STREAMER_BATCHSIZE": 8}, init=False)
    hint = "STREAMER_BATCHSIZE is not a setting.*did you mean STREAMER_BATCH_SIZE"
    with pytest.raises(ConfigurationError, match=hint):
        streamer.init_app(app)


def test_settings_of_other_extensions_are_left_alone(make_app):
    """Only ``STREAMER_*`` keys are the extension's: others are never refused."""
    app, streamer = make_app({"STREAM_SIZE": 1, "MY_STREAMER_BATCH": "x"})
    streamer.add_batched_route("/double", model=double)
    assert app.test_client().post("/double", json=2).get_json() == 4


def test_a_second_init_app_on_the_same_app_is_refused_and_leaves_the_first(make_app):
    """As flask-sqlalchemy and Flask-Caching do: an app is set up once per
    extension; a second init_app (a factory run twice on one app, say)
    says so rather than registering every route and setting again."""
    app, streamer = make_app()
    streamer.add_batched_route("/double", model=double)
    for again in (streamer, FlaskStreamer()):
        with pytest.raises(RuntimeError, match="set up on the app .* already: call init_app\\(app\\) once per app"):
            again.init_app(app)
    assert app.test_client().post("/double", json=2).get_json() == 4, "the first set-up still serves"
    other, _ = make_app(init=False)
    streamer.init_app(other)  # one extension serves several apps, each set up once
    assert other.test_client().post("/double", json=3).get_json() == 6


def test_init_app_starts_nothing_and_does_not_reach_for_redis(make_app, closing_app):
    """Checking the settings is all init_app does: a Redis backend pointing
    nowhere sets up at once, and no streamer is started before a request."""
    from tests.servers import free_port

    started = time.monotonic()
    app, streamer = make_app({"STREAMER_BACKEND": "redis", "STREAMER_REDIS_URL": f"redis://127.0.0.1:{free_port()}/0"})
    streamer.add_batched_route("/double", model=double)
    assert time.monotonic() - started < 1.0
    state = app.extensions["streamer"]
    assert state.handles and not any(handle.started for handle in state.handles.values())


def test_app_settings_and_route_overrides_shape_the_batches(make_app, gated, pool):
    """The app's STREAMER_BATCH_SIZE caps one route's batches; another route
    overriding it with ``batch_size=2`` gets batches of at most 2."""
    app, streamer = make_app({"STREAMER_BATCH_SIZE": 5, "STREAMER_MAX_LATENCY": 0.01})
    other = type(gated)()
    streamer.add_batched_route("/app-wide", "app_wide", gated)
    streamer.add_batched_route("/pairs", "pairs", other, batch_size=2)
    try:
        for path, endpoint, model in (("/app-wide", "app_wide", gated), ("/pairs", "pairs", other)):
            inputs = [f"{endpoint}-{i}" for i in range(12)]
            held, futures = queue_behind_hold(pool, app, path, endpoint, model, inputs)
            model.release()
            assert held.result(10).get_json() == "ok:hold"
            assert [f.result(10).get_json() for f in futures] == [f"ok:{x}" for x in inputs]
            sizes = [len(batch) for batch in model.batches[1:]]
            assert sum(sizes) == 12
            limit = 5 if endpoint == "app_wide" else 2
            assert max(sizes) == limit, f"{endpoint}: batches of {sizes}, expected at most (and once exactly) {limit}"
    finally:
        other.release()


def test_timeout_and_max_queue_can_be_overridden_per_route(make_app, gated, pool):
    app, streamer = make_app({"STREAMER_TIMEOUT": 30})
    streamer.add_batched_route("/quick", "quick", gated, timeout=0.3, max_queue=1, batch_size=8)
    streamer.add_batched_route("/double", model=double)
    held = app.test_client().post("/quick", json="hold")  # held by the model past the route's timeout
    assert error_of(held, 504)["type"] == "StreamerTimeoutError"
    spec = spec_of(app, "quick")
    assert (spec.config.timeout, spec.config.max_queue, spec.config.batch_size) == (0.3, 1, 8)
    assert (spec_of(app, "double").config.timeout, spec_of(app, "double").config.max_queue) == (30, None)
    assert app.test_client().post("/double", json=4).get_json() == 8


def test_backend_can_be_overridden_per_route(make_app):
    app, streamer = make_app({"STREAMER_REDIS_URL": "redis://127.0.0.1:1/0"})
    streamer.add_batched_route("/local", "local", double)
    streamer.add_batched_route("/remote", "remote", double, backend="redis")
    streamer.add_batched_route("/spawned", "spawned", double, backend="process", worker_num=3, cuda_devices="0,1")
    assert spec_of(app, "local").backend == "thread"
    assert spec_of(app, "remote").backend == "redis"
    spawned = spec_of(app, "spawned")
    assert (spawned.backend, spawned.worker_num) == ("process", 3)
    assert spawned.worker_group().devices == (0, 1), "a route's '0,1' means devices 0 and 1"


def test_redis_url_and_prefix_can_be_overridden_per_route(make_app):
    """The issue: every setting, STREAMER_REDIS_URL and STREAMER_PREFIX
    included, is overridable per route (one route's model on another Redis)."""
    app, streamer = make_app({"STREAMER_BACKEND": "redis", "STREAMER_REDIS_URL": "redis://127.0.0.1:1/0"})
    streamer.add_batched_route("/elsewhere", "elsewhere", double, redis_url="redis://127.0.0.1:2/0", prefix="other")
    spec = spec_of(app, "elsewhere")
    assert spec.redis.url == "redis://127.0.0.1:2/0"
    assert spec.prefix.startswith("other")


@pytest.mark.parametrize(
    "option, hint",
    [
        ({"batch_size": 0}, "batch_size of the batched route '/bad' must be a whole number >= 1"),
        ({"max_latency": -0.5}, "max_latency of the batched route '/bad' is in seconds"),
        ({"timeout": 0}, "timeout of the batched route '/bad'"),
        ({"max_queue": 0}, "max_queue of the batched route '/bad'"),
        ({"worker_num": 0}, "worker_num of the batched route '/bad'"),
        ({"cuda_devices": [-1]}, "cuda_devices of the batched route '/bad' holds -1"),
        ({"backend": "gpu"}, "backend of the batched route '/bad' is 'gpu'"),
    ],
)
def test_a_bad_route_option_names_the_route(make_app, option, hint):
    # Declared on a FlaskStreamer already set up on an app: refused at once.
    app, streamer = make_app()
    with pytest.raises(ConfigurationError) as info:
        streamer.add_batched_route("/bad", model=double, **option)
    assert hint in str(info.value)
    assert "double" not in app.view_functions
    # Declared first: refused by init_app.
    late, late_streamer = make_app(init=False)
    late_streamer.add_batched_route("/bad", model=double, **option)
    with pytest.raises(ConfigurationError) as info:
        late_streamer.init_app(late)
    assert hint in str(info.value)


def test_a_refused_route_is_not_kept_by_the_extension(make_app):
    """A route refused for a bad option is not declared: it must not make
    every later ``init_app`` of the extension fail, nor be listed."""
    app, streamer = make_app()
    with pytest.raises(ConfigurationError):
        streamer.add_batched_route("/bad", model=double, batch_size=0)
    assert streamer.routes(app) == []
    other, _ = make_app(init=False)
    streamer.init_app(other)  # raises today: the refused route is still in the extension's list
    assert streamer.routes(other) == []


def test_a_model_that_is_neither_a_function_nor_a_managed_model_is_refused_naming_the_route(make_app):
    """The message names what to change: the route's model (there is no
    STREAMER_MODEL setting to look for)."""

    class NotManaged:
        pass

    app, streamer = make_app()
    for model in (NotManaged, 5):
        with pytest.raises(ConfigurationError) as info:
            streamer.add_batched_route("/x", "x", model)
        message = str(info.value)
        assert "model of the batched route '/x'" in message and "ManagedModel subclass" in message, message
        assert "STREAMER_MODEL" not in message, message


def test_an_unknown_route_option_is_a_type_error_listing_the_known_ones(make_app):
    app, streamer = make_app()
    with pytest.raises(TypeError, match="unknown option.*batchsize.*'/x'.*batch_size"):
        streamer.add_batched_route("/x", model=double, batchsize=4)
    with pytest.raises(TypeError, match="needs a model"):
        streamer.add_batched_route("/y")
    with pytest.raises(TypeError, match="parse of the batched route '/z' must be callable"):
        streamer.add_batched_route("/z", model=double, parse="json")
    with pytest.raises(TypeError, match="batch_size"):
        streamer.batched_route("/w", batchsize=4)(double)


def test_settings_from_flask_environment_variables(make_app, monkeypatch):
    """``app.config.from_prefixed_env()`` gives strings and JSON values:
    ``FLASK_STREAMER_CUDA_DEVICES=0,1`` is devices 0 and 1."""
    monkeypatch.setenv("FLASK_STREAMER_BACKEND", "redis")
    monkeypatch.setenv("FLASK_STREAMER_REDIS_URL", "redis://127.0.0.1:1/0")
    monkeypatch.setenv("FLASK_STREAMER_CUDA_DEVICES", "0,1")
    monkeypatch.setenv("FLASK_STREAMER_WORKER_NUM", "4")
    monkeypatch.setenv("FLASK_STREAMER_BATCH_SIZE", "8")
    monkeypatch.setenv("FLASK_STREAMER_MAX_LATENCY", "0.02")
    app, streamer = make_app(init=False)
    app.config.from_prefixed_env()
    streamer.add_batched_route("/double", model=double)
    streamer.init_app(app)
    spec = spec_of(app, "double")
    assert (spec.backend, spec.redis.url) == ("redis", "redis://127.0.0.1:1/0")
    assert (spec.config.batch_size, spec.config.max_latency) == (8, 0.02)
    group = spec.worker_group()
    assert (group.worker_num, group.devices) == (4, (0, 1))
    assert group.options["batch_size"] == 8


def test_a_setting_missing_from_the_environment_is_named_as_the_variable_to_set(make_app, monkeypatch):
    """What a newcomer met: ``FLASK_STREAMER_BACKEND=redis`` and no URL was
    told to set ``STREAMER_REDIS_URL``, which as a variable does nothing."""
    monkeypatch.setenv("FLASK_STREAMER_BACKEND", "redis")
    app, streamer = make_app(init=False)
    app.config.from_prefixed_env()
    with pytest.raises(ConfigurationError) as info:
        streamer.init_app(app)
    [message] = info.value.messages
    assert message.startswith("STREAMER_REDIS_URL (FLASK_STREAMER_REDIS_URL in the environment) must be set"), message
    monkeypatch.delenv("FLASK_STREAMER_BACKEND")
    app, streamer = make_app({"STREAMER_BACKEND": "redis"}, init=False)  # set in code: the config key alone
    with pytest.raises(ConfigurationError) as info:
        streamer.init_app(app)
    assert info.value.messages[0].startswith("STREAMER_REDIS_URL must be set"), info.value.messages


def test_a_bad_environment_variable_fails_init_app(make_app, monkeypatch):
    monkeypatch.setenv("FLASK_STREAMER_BATCH_SIZE", "many")
    app, streamer = make_app(init=False)
    app.config.from_prefixed_env()
    with pytest.raises(ConfigurationError, match="STREAMER_BATCH_SIZE must be a whole number >= 1, got 'many'"):
        streamer.init_app(app)


def test_a_bad_setting_from_the_environment_is_named_as_the_user_wrote_it(make_app, monkeypatch):
    monkeypatch.setenv("FLASK_STREAMER_BACKEND", "proces")
    monkeypatch.setenv("FLASK_STREAMER_BACKNED", "redis")
    app, streamer = make_app(init=False)
    app.config.from_prefixed_env()
    app.config["STREAMER_BATCH_SIZE"] = 0  # set in code: named as the config key
    with pytest.raises(ConfigurationError) as info:
        streamer.init_app(app)
    assert info.value.messages == [
        "FLASK_STREAMER_BACKNED is not a setting of flask_streamer; did you mean FLASK_STREAMER_BACKEND?",
        "FLASK_STREAMER_BACKEND is 'proces'; use one of 'thread', 'process', 'redis'",
        "STREAMER_BATCH_SIZE must be a whole number >= 1, got 0",
    ]


ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    "variable, value, said",
    [
        (
            "FLASK_STREAMER_BACKEND",
            "proces",
            "FLASK_STREAMER_BACKEND is 'proces'; use one of 'thread', 'process', 'redis'",
        ),
        # the example's own setting, named as written, not as the route keyword it feeds
        ("FLASK_CLASSIFY_BATCH_SIZE", "-3", "FLASK_CLASSIFY_BATCH_SIZE must be a whole number >= 1, got -3"),
        (
            "FLASK_EMBEDDING_PRECISION",
            "half",
            "FLASK_EMBEDDING_PRECISION must be one of auto, float32, bfloat16, got 'half'",
        ),
    ],
)
def test_the_example_with_a_bad_setting_prints_one_line_naming_it(variable, value, said):
    import subprocess
    import sys

    env = dict(os.environ, PYTHONPATH=str(ROOT), **{variable: value})
    result = subprocess.run(
        [sys.executable, "-m", "example_flask"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [f"example_flask: error: {said}"]


def test_one_extension_serves_several_apps_each_with_its_own_settings_and_streamers(closing_app):
    """The application-factory pattern: routes declared on a FlaskStreamer
    made without an app, then ``init_app`` on two apps."""
    streamer = FlaskStreamer()
    streamer.add_batched_route("/sized", model=sized)

    def create(batch_size: int, timeout: float) -> Flask:
        app = closing_app(Flask(f"factory_{batch_size}"))
        app.config.update(STREAMER_BATCH_SIZE=batch_size, STREAMER_TIMEOUT=timeout)
        streamer.init_app(app)
        return app

    first, second = create(2, 5.0), create(5, 7.0)
    # A route declared after both apps were set up reaches both.
    streamer.add_batched_route("/double", model=double)
    for app in (first, second):
        client = app.test_client()
        assert client.post("/sized", json="a").get_json() == {"x": "a", "n": 1}
        assert client.post("/double", json=21).get_json() == 42
    a, b = streamer.get_streamer("sized", first), streamer.get_streamer("sized", second)
    assert a is not b
    assert (a.config.batch_size, a.config.timeout) == (2, 5.0)
    assert (b.config.batch_size, b.config.timeout) == (5, 7.0)
    assert spec_of(first, "sized").prefix == "factory_2:sized" and spec_of(second, "sized").prefix == "factory_5:sized"
    streamer.close(first)
    assert a.closed and not b.closed, "closing one app's streamers leaves the other's running"
    assert second.test_client().post("/sized", json="b").get_json() == {"x": "b", "n": 1}
    with first.app_context():
        assert [route.name for route in streamer.routes()] == ["sized", "double"]


def test_a_cost_budget_from_the_settings_and_the_route_shapes_the_batches(make_app, pool):
    """``STREAMER_ITEM_COST`` as an import path, ``max_batch_cost`` and
    ``batch_cost`` as route keywords: no batch goes over the budget, and an
    input that cannot be costed is the client's error (400), alone."""
    app, streamer = make_app({"STREAMER_ITEM_COST": "tests.flask.apps:text_cost", "STREAMER_MAX_LATENCY": 0.02})
    streamer.add_batched_route("/batch", "batch", with_batch, batch_size=8, max_batch_cost=12, batch_cost="sum")
    spec = spec_of(app, "batch")
    assert (spec.config.item_cost, spec.config.max_batch_cost, spec.config.batch_cost) == (text_cost, 12, "sum")
    texts = ["x" * (1 + i % 6) for i in range(60)]
    responses = list(pool.map(lambda t: app.test_client().post("/batch", json=t), texts))
    answers = [response.get_json() for response in responses]
    assert [answer["x"] for answer in answers] == texts
    batches = [answer["batch"] for answer in answers]
    for batch in batches:
        assert len(batch) == 1 or sum(map(len, batch)) <= 12, f"over the budget: {batch}"
    assert max(map(len, batches)) > 1, "nothing was ever batched"
    error = error_of(app.test_client().post("/batch", json=[1, 2]), 400)
    assert error["type"] == "ItemCostError" and "expected a text, got list" in error["message"]
    assert app.test_client().post("/batch", json="still").get_json() == {"x": "still", "batch": ["still"]}


def test_one_gpu_written_as_a_single_number_is_that_device_everywhere(make_app, monkeypatch):
    """``FLASK_STREAMER_CUDA_DEVICES=0`` (Flask reads it as JSON: the number
    0), the device a one-GPU user writes, stopped gunicorn from booting. It
    is device 0, in the settings, the route keyword and ``--devices``."""
    monkeypatch.setenv("FLASK_STREAMER_CUDA_DEVICES", "0")
    monkeypatch.setenv("FLASK_STREAMER_BACKEND", "redis")
    monkeypatch.setenv("FLASK_STREAMER_REDIS_URL", "redis://127.0.0.1:1/0")
    app, streamer = make_app(init=False)
    app.config.from_prefixed_env()
    assert app.config["STREAMER_CUDA_DEVICES"] == 0
    streamer.add_batched_route("/double", model=double)
    streamer.add_batched_route("/other", "other", double, cuda_devices=1)
    streamer.init_app(app)
    assert spec_of(app, "double").cuda_devices == (0,)
    assert spec_of(app, "other").cuda_devices == (1,)
    assert spec_of(app, "double").worker_group(None, "0").devices == (0,)
    assert spec_of(app, "double").worker_group(None, 1).devices == (1,)


#: Texts a user may give a FLASK_STREAMER_* variable, read as JSON where they parse.
ODD_TEXTS = ["0", "1", "-1", "1.5", "true", "false", "null", "[]", "[0]", "{}", '"x"', "abc", "", "0,1"]


@pytest.mark.parametrize("field", [*DEFAULTS, *APP_DEFAULTS, *APP_OPTIONS])
def test_any_text_in_any_setting_variable_is_read_or_refused_by_name(make_app, monkeypatch, field):
    """Every setting read from the environment through Flask's JSON reading
    (a number where text is expected, ``true`` where a list is): either the
    obvious reading or a ConfigurationError naming the variable as written,
    never another exception."""
    variable = f"FLASK_STREAMER_{field.upper()}"
    for text in ODD_TEXTS:
        monkeypatch.setenv(variable, text)
        app, streamer = make_app(init=False)
        app.config.from_prefixed_env()
        streamer.add_batched_route("/double", model=double)
        try:
            streamer.init_app(app)
        except ConfigurationError as exc:
            assert all(variable in message or "STREAMER_REDIS_URL" in message for message in exc.messages), (
                text,
                exc.messages,
            )
        else:
            assert streamer.routes(app), (text, "set up, and serving its routes")


@pytest.mark.parametrize(
    "variable, text, field, reading",
    [
        ("FLASK_STREAMER_CUDA_DEVICES", "1", "cuda_devices", (1,)),
        ("FLASK_STREAMER_CUDA_DEVICES", "0,1", "cuda_devices", (0, 1)),
        ("FLASK_STREAMER_CUDA_DEVICES", "cuda:0", "cuda_devices", (0,)),
        ("FLASK_STREAMER_CUDA_DEVICES", "cuda:1,cuda:0", "cuda_devices", (1, 0)),
        ("FLASK_STREAMER_CUDA_DEVICES", "GPU-5d0e7f9a", "cuda_devices", ("GPU-5d0e7f9a",)),
        ("FLASK_STREAMER_PREFIX", "2024", "prefix", "2024:double"),
    ],
)
def test_the_obvious_reading_of_a_setting_variable(make_app, monkeypatch, variable, text, field, reading):
    monkeypatch.setenv(variable, text)
    app, streamer = make_app(init=False)
    app.config.from_prefixed_env()
    streamer.add_batched_route("/double", model=double)
    streamer.init_app(app)
    assert getattr(spec_of(app, "double"), field) == reading


def test_routes_and_flags_read_as_false_are_off(make_app, monkeypatch):
    monkeypatch.setenv("FLASK_STREAMER_METRICS_ROUTE", "false")
    monkeypatch.setenv("FLASK_STREAMER_JSON_ERRORS", "1")
    app, streamer = make_app(init=False)
    app.config.from_prefixed_env()
    streamer.init_app(app)
    client = app.test_client()
    assert error_of(client.get("/metrics"), 404)["type"] == "NotFound", "no metrics route, and a JSON 404"


@pytest.mark.parametrize("text", ["gpu0", "cuda:x", "cuda", "GPU-"])
def test_a_device_that_is_neither_an_index_nor_a_uuid_is_refused(make_app, monkeypatch, text):
    monkeypatch.setenv("FLASK_STREAMER_CUDA_DEVICES", text)
    app, streamer = make_app(init=False)
    app.config.from_prefixed_env()
    streamer.add_batched_route("/double", model=double)
    with pytest.raises(ConfigurationError, match=f"STREAMER_CUDA_DEVICES holds '{text}': name a device by its index"):
        streamer.init_app(app)


def test_devices_the_model_cannot_use_are_said_in_the_log(make_app, caplog, monkeypatch):
    """Devices asked for where they change nothing are said, not silently
    ignored: a function on the thread backend (it runs here as it is), and
    a model loaded on a device while torch sees no CUDA device (it runs on
    the CPU)."""
    from tests.core.models import TorchDoubler

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # the thread backend sets it here: restored after the test

    app, streamer = make_app({"STREAMER_CUDA_DEVICES": "cuda:0"}, init=False)
    streamer.add_batched_route("/double", model=double)
    streamer.add_batched_route("/torch", "torch", TorchDoubler)
    with caplog.at_level("WARNING", logger="streamer_core"):
        streamer.init_app(app)
        assert app.test_client().post("/double", json=2).get_json() == 4
        assert app.test_client().post("/torch", json=2).get_json() == 4.0
    lines = [record.getMessage() for record in caplog.records]
    assert any(line.startswith("double: cuda_devices is not used by the thread backend") for line in lines), lines
    [no_cuda] = [line for line in lines if "torch sees no CUDA device" in line]
    assert no_cuda.startswith("device 0 was asked for") and "CUDA_VISIBLE_DEVICES=0" in no_cuda, no_cuda


@pytest.mark.parametrize("backend", ["thread", "process"])
def test_the_settings_reach_the_streamer_as_one_object_checked_once(make_app, backend):
    """The BatchingConfig made from the app's settings (each value checked
    once, under its setting's name) is the one the streamer forms batches by:
    no round trip through keywords that checks each value again."""
    app, streamer = make_app({"STREAMER_BACKEND": backend, "STREAMER_MAX_BATCH_COST": 12}, init=False)
    streamer.add_batched_route("/double", model=double)
    streamer.init_app(app)
    with app.app_context():
        assert streamer.get_streamer("double").config is spec_of(app, "double").config


@pytest.mark.parametrize("devices, unused", [([0], False), ([0, 1], True)])
def test_the_thread_backend_says_which_devices_of_a_managed_model_it_leaves(
    make_app, caplog, monkeypatch, devices, unused
):
    """A ManagedModel on the thread backend runs once, on the first device:
    the others are said to be unused, and with one device nothing is said."""
    from tests.core.models import EnvModel

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # the thread backend sets it here: restored after the test
    app, streamer = make_app({"STREAMER_CUDA_DEVICES": devices}, init=False)
    streamer.add_batched_route("/env", "env", EnvModel)
    with caplog.at_level("WARNING", logger="streamer_core"):
        streamer.init_app(app)
        [answer] = [app.test_client().post("/env", json=1).get_json()]
    assert answer["gpu_id"] == 0 and answer["cvd"] == "0"
    said = [record.getMessage() for record in caplog.records if "not used" in record.getMessage()]
    if unused:
        [line] = said
        assert line.startswith("env: the thread backend runs one copy of the model, on device 0"), line
    else:
        assert said == []


def test_model_threads_from_the_settings_and_a_route_run_its_batches_at_once(make_app, pool):
    """``STREAMER_MODEL_THREADS`` gives every thread-backend route that many
    model threads, a route's ``model_threads`` its own: each batch here
    waits until as many run beside it."""
    app, streamer = make_app({"STREAMER_MODEL_THREADS": 2, "STREAMER_BATCH_SIZE": 1, "STREAMER_MAX_LATENCY": 0})
    barriers = {"pairs": threading.Barrier(2, timeout=5), "triples": threading.Barrier(3, timeout=5)}

    def model(name: str):
        def predict(batch):
            barriers[name].wait()
            return [x * 2 for x in batch]

        return predict

    streamer.add_batched_route("/pairs", "pairs", model("pairs"))
    streamer.add_batched_route("/triples", "triples", model("triples"), model_threads=3)
    assert (spec_of(app, "pairs").model_threads, spec_of(app, "triples").model_threads) == (2, 3)
    for path, n in (("/pairs", 2), ("/triples", 3)):
        answers = [pool.submit(lambda i=i, path=path: app.test_client().post(path, json=i)) for i in range(n)]
        assert [a.result(10).get_json() for a in answers] == [2 * i for i in range(n)]
