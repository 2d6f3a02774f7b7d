"""Priority levels through Flask routes: a route's own level, a route
serving another route's model (its queue) at another level, the
``X-Priority`` header where a route allows it (and only there), a 400 for
a header that is not a level, and the route options checked as they are
declared."""

from __future__ import annotations

from concurrent.futures import Future
from typing import Any, Callable, List, Tuple

import pytest
from flask import Flask

from flask_streamer import ConfigurationError, FlaskStreamer
from tests.flask.conftest import error_of, post_in_thread, spec_of
from tests.helpers import wait_for

LEVELS = {"STREAMER_PRIORITY_LEVELS": 2, "STREAMER_BATCH_SIZE": 2, "STREAMER_MAX_LATENCY": 0.01}


def _held(app: Flask, streamer: FlaskStreamer, gate: Any, pool: Any, path: str) -> List[Future[Any]]:
    """Hold the gated model busy with one request, and a full batch handed
    ahead to it (as a busy worker takes one), so what comes next queues."""
    held: List[Any] = [post_in_thread(pool, app, path, json="hold")]
    assert gate.entered.wait(10), "the held request never reached the model"
    queue = streamer.get_streamer(path.strip("/"), app)
    held.append(queue.submit(["ahead0", "ahead1"], priority=1))  # from Python, beside the routes
    assert wait_for(lambda: queue.queued() == 0, 10), "the batch was not handed ahead"
    return held


def _queue(app: Flask, pool: Any, queued: Callable[[], int], requests: List[Tuple[str, str, Any]]) -> List[Future[Any]]:
    """Send ``(path, input, headers)`` one by one, each queued before the next."""
    futures = []
    for path, value, headers in requests:
        futures.append(post_in_thread(pool, app, path, json=value, headers=headers or {}))
        count = len(futures)
        assert wait_for(lambda n=count: queued() == n, 10), f"{value} was not queued"
    return futures


def _after_hold(gate: Any) -> List[List[Any]]:
    """The batches run after the held one and the one handed ahead."""
    batches = gate.batches
    return batches[[index for index, batch in enumerate(batches) if "ahead0" in batch][0] + 1 :]


def test_a_route_serving_another_routes_model_queues_there_at_its_own_level(make_app, gated, pool):
    app, streamer = make_app(LEVELS)
    streamer.add_batched_route("/search", "search", gated, priority=1)
    streamer.add_batched_route("/reindex", "reindex", model="search", priority=2)
    queue = streamer.get_streamer("search", app)
    assert streamer.get_streamer("reindex", app) is queue, "one model, one queue"
    held = _held(app, streamer, gated, pool, "/search")
    futures = _queue(
        app,
        pool,
        queue.queued,
        [("/reindex", "doc0", None), ("/reindex", "doc1", None), ("/reindex", "doc2", None), ("/search", "q", None)],
    )
    gated.release()
    assert [future.result(10).get_json() for future in futures] == ["ok:doc0", "ok:doc1", "ok:doc2", "ok:q"]
    assert held[0].result(10).status_code == 200 and held[1].result(10) == ["ok:ahead0", "ok:ahead1"]
    assert _after_hold(gated)[:2] == [["q", "doc0"], ["doc1", "doc2"]], "the search, sent last, goes first"


def test_the_priority_header_chooses_the_level_only_where_the_route_allows_it(make_app, gated, pool):
    app, streamer = make_app(LEVELS)
    streamer.add_batched_route("/public", "public", gated)  # no header: the model's default, the lowest
    streamer.add_batched_route("/internal", "internal", model="public", priority_header=True)
    streamer.add_batched_route("/named", "named", model="public", priority=2, priority_header="X-Request-Priority")
    queue = streamer.get_streamer("public", app)
    held = _held(app, streamer, gated, pool, "/public")
    futures = _queue(
        app,
        pool,
        queue.queued,
        [
            ("/public", "jumper", {"X-Priority": "1"}),  # ignored: the route does not allow it
            ("/internal", "bulk", None),  # no header: the default, 2
            ("/named", "other-header", {"X-Priority": "1"}),  # not its header: its own level, 2
            ("/named", "named", {"X-Request-Priority": " 1 "}),
            ("/internal", "urgent", {"X-Priority": "1"}),
        ],
    )
    gated.release()
    assert all(future.result(10).status_code == 200 for future in futures + held[:1])
    assert _after_hold(gated)[:3] == [["named", "urgent"], ["jumper", "bulk"], ["other-header"]]


@pytest.mark.parametrize("value", ["0", "3", "-1", "1.5", "high", "", "1,2", "99999999999999999999"])
def test_a_priority_header_that_is_not_a_level_is_a_400_before_anything_is_queued(make_app, value):
    app, streamer = make_app(LEVELS)
    ran: List[Any] = []
    streamer.add_batched_route("/rank", "rank", lambda batch: ran.extend(batch) or batch, priority_header=True)
    invalid = streamer.get_streamer("rank", app).stats().requests["invalid"]  # this process's, every test's
    response = app.test_client().post("/rank", json="x", headers={"X-Priority": value})
    error = error_of(response, 400)
    assert "the X-Priority header must be a whole number from 1 (the highest priority) to 2" in error["message"]
    assert ran == [] and streamer.get_streamer("rank", app).stats().requests["invalid"] == invalid + 1
    assert app.test_client().post("/rank", json="x", headers={"X-Priority": "2"}).get_json() == "x"


def test_a_priority_header_that_is_not_a_level_is_refused_before_the_body_is_read(make_app):
    """The header is checked first: a request with a wrong X-Priority gets
    the 400 that names the levels, and its body is never parsed (nor a bad
    body's error given in its place)."""
    app, streamer = make_app(LEVELS)
    parsed: List[Any] = []

    def parse(request: Any) -> Any:
        parsed.append(request.get_data())
        raise ValueError("this body is no good")

    streamer.add_batched_route("/parsed", "parsed", lambda batch: batch, parse=parse, priority_header=True)
    response = app.test_client().post("/parsed", data=b"not json", headers={"X-Priority": "7"})
    error = error_of(response, 400)
    assert "the X-Priority header must be a whole number from 1 (the highest priority) to 2" in error["message"], error
    assert parsed == [], "the body was parsed before the header was checked"
    error = error_of(app.test_client().post("/parsed", data=b"not json", headers={"X-Priority": "1"}), 400)
    assert "this body is no good" in error["message"] and parsed == [b"not json"]


def test_route_priority_options_are_checked_as_the_route_is_declared(make_app):
    app, streamer = make_app(LEVELS)
    for options, kind, message in [
        ({"priority": 0}, ValueError, "priority of the batched route '/r' must be a whole number >= 1"),
        ({"priority": "1"}, TypeError, "priority of the batched route '/r' must be a whole number"),
        ({"priority": True}, TypeError, "priority of the batched route '/r' must be a whole number"),
        ({"priority_header": "X Priority"}, TypeError, "priority_header of the batched route '/r' must be True"),
        ({"priority_header": 1}, TypeError, "priority_header of the batched route '/r' must be True"),
        ({"priority": 3}, ConfigurationError, "priority of the batched route '/r' is 3, but its model has 2"),
        ({"priority_levels": 1, "priority_header": True}, ConfigurationError, "set priority_levels of the batched"),
    ]:
        with pytest.raises(kind, match=message):
            streamer.add_batched_route("/r", "r", lambda batch: batch, **options)
    assert "r" not in app.view_functions, "a refused route leaves no trace"
    streamer.add_batched_route("/own", "own", lambda batch: batch, batch_size=4)
    for options, message in [
        ({"batch_size": 8}, "set batch_size on that route instead"),
        ({"init_kwargs": {"a": 1}}, "set init_kwargs on that route instead"),
    ]:
        with pytest.raises(TypeError, match=message):
            streamer.add_batched_route("/shared", "shared", model="own", **options)
    with pytest.raises(TypeError, match="an endpoint name of its own"):
        streamer.add_batched_route("/shared", model="own")
    with pytest.raises(ConfigurationError, match="serves the model of the batched route 'nope', which this app"):
        streamer.add_batched_route("/shared", "shared", model="nope")
    with pytest.raises(ConfigurationError, match="STREAMER_PRIORITY_LEVELS is 2"):
        streamer.add_batched_route("/shared", "shared", model="own", priority=3)


def test_a_route_declared_before_init_app_is_checked_against_the_apps_levels(make_app, closing_app):
    app, streamer = make_app({"STREAMER_PRIORITY_LEVELS": 1}, init=False)
    streamer.add_batched_route("/r", "r", lambda batch: batch, priority=2)
    with pytest.raises(ConfigurationError, match="priority of the batched route '/r' is 2, but its model has 1"):
        streamer.init_app(app)
    other = closing_app(Flask("flask_test_levels_other"))
    other.config["STREAMER_PRIORITY_LEVELS"] = 3
    streamer.init_app(other)  # the same route under other settings: a level there
    assert other.test_client().post("/r", json=5).get_json() == 5


def test_the_commands_count_a_model_two_routes_serve_once(make_app):
    app, streamer = make_app(LEVELS)
    streamer.add_batched_route("/search", "search", lambda batch: batch, priority=1)
    streamer.add_batched_route("/reindex", "reindex", model="search", priority=2)
    result = app.test_cli_runner().invoke(args=["streamer", "status"])
    assert result.exit_code == 0, result.output
    assert [line.split()[0] for line in result.output.splitlines() if not line.startswith(" ")] == ["search"], (
        "one model, so one status (and one set of workers)"
    )


def test_a_route_with_its_own_level_and_no_header_ignores_the_header(make_app):
    """``priority=N`` without ``priority_header``: the header neither moves
    the request (a public route cannot be jumped) nor is read (no 400)."""
    app, streamer = make_app(LEVELS)
    streamer.add_batched_route("/fixed", "fixed", lambda batch: batch, priority=2)
    queue = streamer.get_streamer("fixed", app)
    before = [level.requests["ok"] for level in queue.stats().priorities]
    for value in ("1", "junk"):
        assert app.test_client().post("/fixed", json=value, headers={"X-Priority": value}).get_json() == value
    after = [level.requests["ok"] for level in queue.stats().priorities]
    assert [b - a for a, b in zip(before, after)] == [0, 2], "both ran at the route's level, 2"


def test_a_redis_models_level_settings_reach_its_web_side_and_its_workers(make_app, redis_url):
    """The route's priority settings are the web side's RedisStreamer's
    (its per-level bounds, timeouts and default) and the workers' that
    ``run-workers`` starts (the levels they read, their aging)."""
    app, streamer = make_app(
        {
            "STREAMER_BACKEND": "redis",
            "STREAMER_REDIS_URL": redis_url,
            "STREAMER_PRIORITY_LEVELS": 2,
            "STREAMER_DEFAULT_PRIORITY": 1,
            "STREAMER_PRIORITY_MAX_QUEUE": [None, 5],
            "STREAMER_PRIORITY_TIMEOUT": [None, 0.3],
            "STREAMER_PRIORITY_AGING": 5,
        }
    )
    streamer.add_batched_route("/ranked", "ranked", lambda batch: batch)
    config = streamer.get_streamer("ranked", app)._config
    assert (config.priority_levels, config.default_priority) == (2, 1)
    assert (config.priority_max_queue, config.priority_timeout) == ((None, 5), (None, 0.3))
    options = spec_of(app, "ranked").worker_group().options
    assert (options["priority_levels"], options["priority_aging"]) == (2, 5.0)
