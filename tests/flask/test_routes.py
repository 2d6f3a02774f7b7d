"""Several batched routes in one app, each with its own queue; routes in
blueprints; routes declared after the extension was set up; looking
streamers up; closing them."""

from __future__ import annotations

import threading
from concurrent.futures import wait

import pytest
from flask import Blueprint, Flask

from flask_streamer import FlaskStreamer
from tests.flask.apps import GatedModel, double, sized
from tests.flask.conftest import post_in_thread, spec_of


class Recorder:
    """A thread-backend model that records its batches and tags its outputs."""

    def __init__(self, tag: str) -> None:
        self.tag = tag
        self.batches = []

    def __call__(self, batch):
        self.batches.append(list(batch))
        return [f"{self.tag}:{x}" for x in batch]


def test_two_routes_have_their_own_queues_and_batches_never_mix(make_app, pool):
    app, streamer = make_app({"STREAMER_MAX_LATENCY": 0.05, "STREAMER_BATCH_SIZE": 16})
    left, right = Recorder("L"), Recorder("R")
    streamer.add_batched_route("/left", "left", left)
    streamer.add_batched_route("/right", "right", right)
    futures = {}
    for i in range(12):
        futures[("left", i)] = post_in_thread(pool, app, "/left", json=f"l{i}")
        futures[("right", i)] = post_in_thread(pool, app, "/right", json=f"r{i}")
    for (route, i), future in futures.items():
        response = future.result(10)
        assert response.status_code == 200
        assert response.get_json() == ("L:l" if route == "left" else "R:r") + str(i)
    assert sorted(x for batch in left.batches for x in batch) == sorted(f"l{i}" for i in range(12))
    assert sorted(x for batch in right.batches for x in batch) == sorted(f"r{i}" for i in range(12))
    assert streamer.get_streamer("left", app) is not streamer.get_streamer("right", app)


def test_a_held_route_does_not_hold_the_others(make_app, gated, pool):
    """One model busy (held) leaves every other route answering."""
    app, streamer = make_app()
    streamer.add_batched_route("/gated", "gated", gated)
    streamer.add_batched_route("/double", model=double)
    held = post_in_thread(pool, app, "/gated", json="hold")
    assert gated.entered.wait(10)
    assert app.test_client().post("/double", json=5).get_json() == 10
    assert not held.done()
    gated.release()
    assert held.result(10).get_json() == "ok:hold"


def test_a_blueprint_route_is_served_under_the_blueprint_prefix(make_app):
    app, streamer = make_app()
    bp = Blueprint("v1", __name__)
    route = streamer.add_batched_route("/double", model=double, blueprint=bp)
    streamer.add_batched_route("/sized", model=sized)
    assert route.name == "v1.double"
    with app.app_context():
        assert [r.name for r in streamer.routes()] == ["sized"], "not served before the blueprint is registered"
    app.register_blueprint(bp, url_prefix="/v1")
    client = app.test_client()
    assert client.post("/v1/double", json=4).get_json() == 8
    assert client.post("/double", json=4).status_code == 404
    with app.app_context():
        assert [r.name for r in streamer.routes()] == ["v1.double", "sized"]
        assert streamer.get_streamer("v1.double") is streamer.get_streamer("double")
    with app.test_request_context():
        from flask import url_for

        assert url_for("v1.double") == "/v1/double"


def test_routes_of_the_same_endpoint_in_two_blueprints_keep_their_redis_keys_apart(make_app):
    """``v1.embed`` and ``v2.embed`` are two models: each names its Redis
    keys after the route's full name, or the workers of one would take the
    other's requests."""
    app, streamer = make_app(
        {"STREAMER_BACKEND": "redis", "STREAMER_REDIS_URL": "redis://127.0.0.1:1/0", "STREAMER_PREFIX": "svc"}
    )
    for version in ("v1", "v2"):
        bp = Blueprint(version, __name__)
        streamer.add_batched_route("/embed", model=double, blueprint=bp, endpoint="embed")
        app.register_blueprint(bp, url_prefix=f"/{version}")
    assert [spec_of(app, name).prefix for name in ("v1.embed", "v2.embed")] == ["svc:v1.embed", "svc:v2.embed"]


def test_a_blueprint_declared_with_the_decorator_works_in_an_app_factory(closing_app):
    streamer = FlaskStreamer()
    bp = Blueprint("api", __name__, url_prefix="/api")

    @streamer.batched_route("/sized", blueprint=bp, batch_size=3)
    def api_sized(batch):
        return sized(batch)

    assert api_sized([1]) == [{"x": 1, "n": 1}], "the decorator returns the function unchanged"
    app = closing_app(Flask("bp_factory"))
    streamer.init_app(app)
    app.register_blueprint(bp)
    assert app.test_client().post("/api/sized", json="x").get_json() == {"x": "x", "n": 1}
    assert streamer.get_streamer("api.api_sized", app).config.batch_size == 3


def test_get_streamer_calls_the_route_model_from_a_view_of_your_own(make_app):
    app, streamer = make_app()
    streamer.add_batched_route("/double", model=double)

    @app.post("/double-all")
    def double_all():
        from flask import request

        return {"out": streamer.get_streamer("double").predict(request.get_json())}

    assert app.test_client().post("/double-all", json=[1, 2, 3]).get_json() == {"out": [2, 4, 6]}
    with app.app_context():
        with pytest.raises(KeyError, match="no batched route 'nope' in this app .batched routes: double"):
            streamer.get_streamer("nope")


def test_routes_lists_the_app_s_batched_routes(make_app):
    app, streamer = make_app()
    first = streamer.add_batched_route("/a", "a", double, methods=["PUT"])
    second = streamer.add_batched_route("/b", "b", sized)
    assert streamer.routes(app) == [first, second]
    assert (first.rule, first.methods, first.endpoint) == ("/a", ["PUT"], "a")
    client = app.test_client()
    assert client.put("/a", json=1).get_json() == 2
    assert client.post("/a", json=1).status_code == 405


def test_a_route_declared_after_the_extension_was_set_up_is_served(make_app):
    app, streamer = make_app()
    assert streamer.routes(app) == []

    @streamer.batched_route("/late")
    def late(batch):
        return [f"late:{x}" for x in batch]

    assert app.test_client().post("/late", json="x").get_json() == "late:x"
    assert [r.name for r in streamer.routes(app)] == ["late"]


def test_close_stops_the_streamers_and_the_next_request_starts_new_ones(make_app):
    app, streamer = make_app()
    streamer.add_batched_route("/double", model=double)
    client = app.test_client()
    assert client.post("/double", json=1).get_json() == 2
    before = streamer.get_streamer("double", app)
    streamer.close(app)
    assert before.closed
    assert client.post("/double", json=2).get_json() == 4
    after = streamer.get_streamer("double", app)
    assert after is not before and not after.closed


def test_start_starts_every_route_before_the_first_request(make_app):
    app, streamer = make_app()
    model = GatedModel()
    streamer.add_batched_route("/gated", "gated", model)
    streamer.add_batched_route("/double", model=double)
    state = app.extensions["streamer"]
    assert not any(handle.started for handle in state.handles.values())
    streamer.start(app)
    assert all(handle.started for handle in state.handles.values())


def test_a_route_of_an_extension_the_app_was_not_set_up_with_is_refused(make_app):
    """A blueprint whose batched routes belong to a FlaskStreamer never
    set up on this app says what to do, not a KeyError."""
    app, _ = make_app()
    other = FlaskStreamer()
    bp = Blueprint("stray", __name__)
    other.add_batched_route("/double", model=double, blueprint=bp)
    app.register_blueprint(bp)
    app.config["PROPAGATE_EXCEPTIONS"] = True
    with pytest.raises(RuntimeError, match="init_app"):
        app.test_client().post("/double", json=1)


def test_concurrent_first_requests_start_one_streamer(make_app, pool):
    def model_threads():
        return {t for t in threading.enumerate() if t.name == "streamer-thread-model"}

    app, streamer = make_app({"STREAMER_MAX_LATENCY": 0.05})
    streamer.add_batched_route("/sized", model=sized)
    before = model_threads()
    futures = [post_in_thread(pool, app, "/sized", json=i) for i in range(16)]
    wait(futures, 10)
    answers = [f.result().get_json() for f in futures]
    assert [a["x"] for a in answers] == list(range(16))
    assert len(model_threads() - before) == 1, "racing first requests must start one streamer, not several"
    assert max(a["n"] for a in answers) > 1, "concurrent requests should share batches"
