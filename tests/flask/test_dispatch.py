"""A batched route's requests dispatched without werkzeug's matching and
Flask's empty steps (flask_streamer.dispatch): werkzeug binds its URL map
for them only at the first request; every answer is the one Flask's own
dispatch gives; every hook, signal, session and middleware an app sets up
still acts; and Flask's own dispatch wherever the host counts or the app's
class overrides it."""

from __future__ import annotations

import logging
from typing import Any, Dict, List, Optional, Tuple

import flask
import pytest
from flask import Blueprint, Flask, after_this_request, request, session, url_for
from werkzeug.middleware.proxy_fix import ProxyFix
from werkzeug.routing import Map

from flask_streamer import FlaskStreamer
from tests.flask.apps import double
from tests.helpers import needs_shortcut, shortcut_on


class CountingMap(Map):
    """werkzeug's URL map, counting the requests it is bound to."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.bound = 0

    def bind_to_environ(self, *args: Any, **kwargs: Any) -> Any:
        self.bound += 1
        return super().bind_to_environ(*args, **kwargs)


class CountingFlask(Flask):
    url_map_class = CountingMap


class FlasksOwnDispatch(CountingFlask):
    """An app whose class overrides one of the methods the fast dispatch
    leans on (doing nothing else): its every request is Flask's."""

    def make_response(self, rv: Any) -> Any:
        return super().make_response(rv)


def made(closing_app, cls: type = CountingFlask, config: Optional[Dict[str, Any]] = None, **route: Any):
    """An app of ``cls`` with ``/double`` (``route``'s keywords) and an
    ordinary ``/plain`` route, ``init_app`` called on it."""
    app = closing_app(cls(f"dispatch_{cls.__name__.lower()}"))
    app.config.update(config or {})
    streamer = FlaskStreamer()
    streamer.add_batched_route("/double", model=double, **route)

    @app.post("/plain")
    def plain() -> Any:
        return {"plain": True}

    streamer.init_app(app)
    return app, streamer


def bound(app: Flask) -> int:
    return app.url_map.bound  # type: ignore[attr-defined,no-any-return]


@needs_shortcut("flask-dispatch")
def test_after_the_first_request_a_batched_route_is_not_matched_by_werkzeug(closing_app):
    app, _ = made(closing_app)
    client = app.test_client()
    assert client.post("/double", json=1).get_json() == 2
    first = bound(app)
    for i in range(5):
        assert client.post("/double", json=i).get_json() == 2 * i
    assert bound(app) == first, "werkzeug bound its map for a batched route's request"
    assert client.post("/plain").get_json() == {"plain": True}
    assert bound(app) == first + 1, "an ordinary route is Flask's to match"


def test_an_app_class_that_overrides_flasks_dispatch_keeps_it(closing_app):
    seen: List[str] = []

    class Overriding(CountingFlask):
        def full_dispatch_request(self) -> Any:
            seen.append(request.path)
            return super().full_dispatch_request()

    app, _ = made(closing_app, Overriding)
    client = app.test_client()
    for i in range(3):
        assert client.post("/double", json=i).get_json() == 2 * i
    assert seen == ["/double"] * 3
    assert bound(app) == 3


REQUESTS: List[Tuple[str, str, Dict[str, Any]]] = [
    ("POST", "/double", {"json": 21}),
    ("POST", "/double", {"data": b"{not json", "content_type": "application/json"}),
    ("POST", "/double", {"data": b"21", "content_type": "text/plain"}),
    ("POST", "/double", {"data": b""}),
    ("POST", "/double", {"json": "x" * 100}),  # over max_body_bytes: 413
    ("GET", "/double", {}),
    ("PUT", "/double", {"json": 1}),
    ("HEAD", "/double", {}),
    ("OPTIONS", "/double", {}),
    ("POST", "/double/", {"json": 1}),
    ("POST", "//double", {"json": 1}),
    ("POST", "/double", {"json": 2, "headers": {"Upgrade": "websocket", "Connection": "Upgrade"}}),
    ("POST", "/double", {"json": 2, "headers": {"X-Priority": "1"}}),
    ("POST", "/plain", {}),
    ("POST", "/nowhere", {}),
]


#: The requests above that the fast dispatch takes: POST to the batched
#: route's own path, not asking for a websocket.
FAST = [m == "POST" and p == "/double" and "Upgrade" not in k.get("headers", {}) for m, p, k in REQUESTS]


@pytest.mark.parametrize("json_errors", [False, True])
@needs_shortcut("flask-dispatch")
def test_every_answer_is_the_one_flasks_own_dispatch_gives(closing_app, json_errors):
    """The same requests, to an app with the fast dispatch and to one whose
    class keeps Flask's: the same status, headers and body, byte for byte;
    werkzeug's map bound as often, but for the requests the fast dispatch takes."""
    answers, binds = [], []
    for cls in (CountingFlask, FlasksOwnDispatch):
        app, _ = made(closing_app, cls, {"STREAMER_JSON_ERRORS": json_errors}, max_body_bytes=64)
        client = app.test_client()
        assert client.post("/double", json=0).status_code == 200  # the first request: Flask's, in both
        got, counts = [], []
        for method, path, kwargs in REQUESTS:
            start = bound(app)
            response = client.open(path, method=method, **kwargs)
            got.append((method, path, response.status, sorted(response.headers.items()), response.get_data()))
            counts.append(bound(app) - start)
        answers.append(got)
        binds.append(counts)
    for ours, flasks in zip(*answers):
        assert ours == flasks
    assert all(count >= 1 for count in binds[1])
    assert binds[0] == [0 if fast else count for fast, count in zip(FAST, binds[1])]


def test_a_routes_view_decorators_act_on_it_as_under_flasks_dispatch(closing_app):
    """A route with ``decorators=`` (flask-httpauth's, which sets no hook
    on the app): its requests still taken by the fast dispatch, each
    answered as Flask's own dispatch answers it."""
    from flask_httpauth import HTTPTokenAuth

    auth = HTTPTokenAuth(scheme="Bearer")
    auth.verify_token(lambda token: "alice" if token == "secret" else None)
    tokens = [{}, {"Authorization": "Bearer wrong"}, {"Authorization": "Bearer secret"}]
    answers, binds = [], []
    for cls in (CountingFlask, FlasksOwnDispatch):
        app, _ = made(closing_app, cls, decorators=[auth.login_required])
        client = app.test_client()
        assert client.post("/double", json=0).status_code == 401  # the first request: Flask's, in both
        start = bound(app)
        got = [client.post("/double", json=3, headers=headers) for headers in tokens]
        answers.append([(r.status, sorted(r.headers.items()), r.get_data()) for r in got])
        binds.append(bound(app) - start)
    assert [status for status, _, _ in answers[0]] == ["401 UNAUTHORIZED", "401 UNAUTHORIZED", "200 OK"]
    assert answers[0] == answers[1]
    fast = shortcut_on("flask-dispatch")  # off: Flask's dispatch takes both apps' requests
    assert binds == [0 if fast else len(tokens), len(tokens)], "the fast dispatch took the decorated route's requests"


def test_the_apps_and_the_blueprints_hooks_run_as_under_flasks_dispatch(closing_app):
    calls: List[str] = []
    app = closing_app(CountingFlask("dispatch_hooks"))
    streamer = FlaskStreamer()
    bp = Blueprint("api", __name__, url_prefix="/api")
    streamer.add_batched_route("/double", model=double, blueprint=bp)
    streamer.add_batched_route("/twice", "twice", double)
    streamer.init_app(app)

    @app.url_value_preprocessor
    def values(endpoint: Optional[str], view_args: Any) -> None:
        calls.append(f"values {endpoint}")

    @app.before_request
    def before() -> Any:
        calls.append(f"before {request.endpoint}")
        return ("refused", 401) if request.headers.get("X-Refuse") else None

    @bp.before_request
    def bp_before() -> None:
        calls.append(f"bp before {request.blueprint}")

    @app.after_request
    def after(response: Any) -> Any:
        calls.append("after")
        response.headers["X-After"] = "yes"
        return response

    @app.teardown_request
    def teardown(exc: Optional[BaseException]) -> None:
        calls.append("teardown")

    app.register_blueprint(bp)
    client = app.test_client()
    for _ in range(2):  # the first request, then the ones after it
        calls.clear()
        response = client.post("/api/double", json=3)
        assert (response.get_json(), response.headers["X-After"]) == (6, "yes")
        assert calls == ["values api.double", "before api.double", "bp before api", "after", "teardown"]
        calls.clear()
        response = client.post("/twice", json=3, headers={"X-Refuse": "1"})
        assert (response.status_code, response.get_data(), response.headers["X-After"]) == (401, b"refused", "yes")
        assert calls == ["values twice", "before twice", "after", "teardown"]


@pytest.mark.parametrize("hook", ["before_request", "after_request", "url_value_preprocessor"])
def test_a_hook_of_the_routes_blueprint_alone_is_run(closing_app, hook):
    calls: List[str] = []
    app = closing_app(CountingFlask(f"dispatch_bp_{hook}"))
    streamer = FlaskStreamer()
    bp = Blueprint("api", __name__, url_prefix="/api")
    streamer.add_batched_route("/double", model=double, blueprint=bp)
    streamer.init_app(app)
    functions = {
        "before_request": lambda: calls.append("before"),
        "after_request": lambda response: calls.append("after") or response,
        "url_value_preprocessor": lambda endpoint, values: calls.append("values"),
    }
    getattr(bp, hook)(functions[hook])
    app.register_blueprint(bp)
    client = app.test_client()
    for i in range(3):
        assert client.post("/api/double", json=i).get_json() == 2 * i
    assert len(calls) == 3


def test_request_signals_connected_after_the_first_request_are_sent(closing_app):
    app, _ = made(closing_app)
    client = app.test_client()
    assert client.post("/double", json=1).get_json() == 2
    for signal in (flask.request_started, flask.request_finished):
        sent: List[Any] = []

        def receiver(sender: Any, sent: List[Any] = sent, **extra: Any) -> None:
            sent.append((sender, request.path))

        signal.connect(receiver, app)
        try:
            assert client.post("/double", json=2).get_json() == 4
        finally:
            signal.disconnect(receiver)  # from every sender: no receiver left for later tests
        assert sent == [(app, "/double")], signal.name


@needs_shortcut("flask-dispatch")
def test_hooks_of_a_request_its_session_and_url_for_act_on_a_batched_route(closing_app):
    """A parse hook that asks for ``after_this_request``, writes the
    session and builds URLs: each works as in any view."""
    seen: List[Any] = []

    def parse(req: Any) -> Any:
        @after_this_request
        def tag(response: Any) -> Any:
            response.headers["X-This-Request"] = "yes"
            return response

        session["count"] = session.get("count", 0) + 1
        seen.append((url_for("double"), url_for("plain", _external=True), req.url_rule.rule, req.endpoint))
        seen.append(req.view_args)
        return req.get_json()

    app, _ = made(closing_app, config={"SECRET_KEY": "not a secret"}, parse=parse)
    client = app.test_client()
    for count in (1, 2, 3):
        seen.clear()
        response = client.post("/double", json=count)
        assert response.get_json() == 2 * count
        assert response.headers["X-This-Request"] == "yes"
        assert "session=" in response.headers["Set-Cookie"]
        assert seen == [("/double", "http://localhost/plain", "/double", "double"), {}]
        with client.session_transaction() as kept:
            assert kept["count"] == count
    assert bound(app) == 1 + 2 * 3, "url_for binds the map where it is used (twice a request), and only there"


@needs_shortcut("flask-dispatch")
def test_a_middleware_set_before_init_app_still_sees_every_request(closing_app):
    seen: List[str] = []

    def parse(req: Any) -> Any:
        seen.append(req.remote_addr)
        return req.get_json()

    app = closing_app(CountingFlask("dispatch_proxied"))
    app.wsgi_app = ProxyFix(app.wsgi_app, x_for=1)  # type: ignore[method-assign]
    streamer = FlaskStreamer()
    streamer.add_batched_route("/double", model=double, parse=parse)
    streamer.init_app(app)
    client = app.test_client()
    for i in range(3):
        assert client.post("/double", json=i, headers={"X-Forwarded-For": f"10.0.0.{i}"}).get_json() == 2 * i
    assert seen == ["10.0.0.0", "10.0.0.1", "10.0.0.2"]
    assert bound(app) == 1


def test_a_view_replaced_after_the_first_request_is_the_one_called(closing_app):
    app, _ = made(closing_app)
    client = app.test_client()
    assert client.post("/double", json=1).get_json() == 2
    original = app.view_functions["double"]
    app.view_functions["double"] = lambda: {"wrapped": original().get_json()}
    assert client.post("/double", json=4).get_json() == {"wrapped": 8}


def test_an_app_trusting_some_hosts_refuses_the_others_on_a_batched_route(closing_app):
    if "TRUSTED_HOSTS" not in Flask.default_config:
        pytest.skip("this Flask has no TRUSTED_HOSTS (Flask 3.1 added it)")
    app, _ = made(closing_app, config={"TRUSTED_HOSTS": ["good.test"]})
    client = app.test_client()
    for _ in range(2):
        assert client.post("/double", json=1, headers={"Host": "good.test"}).get_json() == 2
        assert client.post("/double", json=1, headers={"Host": "evil.test"}).status_code == 400


def test_routes_under_subdomain_matching_are_matched_by_werkzeug(closing_app):
    """With ``subdomain_matching``, a route of no subdomain is the bare
    host's, and one of a blueprint's subdomain is that subdomain's."""
    app = closing_app(CountingFlask("dispatch_subdomains", subdomain_matching=True))
    app.config["SERVER_NAME"] = "example.test"
    streamer = FlaskStreamer()
    bp = Blueprint("api", __name__, subdomain="api")
    streamer.add_batched_route("/double", model=double, blueprint=bp)
    streamer.add_batched_route("/twice", "twice", double)
    streamer.init_app(app)
    app.register_blueprint(bp)
    client = app.test_client()
    for _ in range(2):
        assert client.post("/double", json=2, base_url="http://api.example.test").get_json() == 4
        assert client.post("/double", json=2, base_url="http://www.example.test").status_code == 404
        assert client.post("/twice", json=2, base_url="http://example.test").get_json() == 4
        assert client.post("/twice", json=2, base_url="http://api.example.test").status_code == 404
    assert bound(app) == 8


def test_a_path_that_only_reads_as_the_route_in_latin_1_is_flasks_to_match(closing_app):
    """A server gives a request's path bytes as Latin-1 (PEP 3333), and
    werkzeug reads them as UTF-8: the byte E4 is not the route ``/zählen``."""
    app = closing_app(CountingFlask("dispatch_latin_1"))
    streamer = FlaskStreamer()
    streamer.add_batched_route("/zählen", "count", double)
    streamer.init_app(app)
    client = app.test_client()
    for _ in range(2):
        assert client.post("/zählen", json=2).get_json() == 4
        assert client.post("/", json=2, environ_overrides={"PATH_INFO": "/z\xe4hlen"}).status_code == 404


@needs_shortcut("flask-dispatch")
def test_a_flask_whose_request_context_is_laid_out_otherwise_keeps_its_own_dispatch(closing_app, monkeypatch):
    """A Flask whose request context sets an attribute the fast one does not
    (as a later Flask might): every request is Flask's to dispatch."""
    flasks_init = flask.ctx.RequestContext.__init__

    def init(self: Any, *args: Any, **kwargs: Any) -> None:
        flasks_init(self, *args, **kwargs)
        self.added_by_a_later_flask = True

    monkeypatch.setattr(flask.ctx.RequestContext, "__init__", init)
    app, _ = made(closing_app)
    client = app.test_client()
    for i in range(3):
        assert client.post("/double", json=i).get_json() == 2 * i
    assert bound(app) == 1 + 3, "once to compare the two contexts' layouts, then once a request"


def test_a_hook_may_copy_the_request_context_of_a_batched_route(closing_app):
    """``copy_current_request_context`` (to finish work in another greenlet
    or thread) copies the request's context, its session included."""
    seen: List[Any] = []

    def parse(req: Any) -> Any:
        session["n"] = req.get_json()

        @flask.copy_current_request_context
        def elsewhere() -> Any:
            return (request.path, request.endpoint, session["n"], url_for("plain"))

        seen.append(elsewhere())
        return req.get_json()

    app, _ = made(closing_app, config={"SECRET_KEY": "not a secret"}, parse=parse)
    client = app.test_client()
    for i in range(3):
        assert client.post("/double", json=i).get_json() == 2 * i
    assert seen == [("/double", "double", i, "/plain") for i in range(3)]


def test_setting_the_app_up_after_its_first_request_is_refused_as_by_flask(closing_app):
    app, _ = made(closing_app)
    assert app.test_client().post("/double", json=1).get_json() == 2
    with pytest.raises(AssertionError, match="can no longer be called"):
        app.before_request(lambda: None)


def boom() -> Any:
    """An ordinary view that fails: Flask's 500, its exception handed to the teardown."""
    raise RuntimeError("boom")


def test_teardown_functions_are_run_with_the_requests_exception(closing_app):
    calls: List[Any] = []
    app = closing_app(CountingFlask("dispatch_teardown"))
    streamer = FlaskStreamer()
    bp = Blueprint("api", __name__, url_prefix="/api")
    streamer.add_batched_route("/double", model=double, blueprint=bp)
    bp.add_url_rule("/boom", view_func=boom, methods=["POST"])
    streamer.init_app(app)

    @bp.teardown_request
    def bp_teardown(exc: Optional[BaseException]) -> None:  # a blueprint's alone
        calls.append((request.blueprint, repr(exc)))

    app.register_blueprint(bp)
    client = app.test_client()
    assert client.post("/api/double", json=1).get_json() == 2
    assert client.post("/api/double", json=2).get_json() == 4
    assert client.post("/api/boom").status_code == 500
    assert calls == [("api", "None"), ("api", "None"), ("api", "RuntimeError('boom')")]


def test_the_teardown_signal_connected_after_the_first_request_is_sent(closing_app):
    app, _ = made(closing_app)  # no teardown function
    app.add_url_rule("/boom", view_func=boom, methods=["POST"])
    client = app.test_client()
    assert client.post("/double", json=1).get_json() == 2
    sent: List[Any] = []

    def receiver(sender: Any, exc: Optional[BaseException] = None, **extra: Any) -> None:
        sent.append((sender, request.path, repr(exc)))

    flask.request_tearing_down.connect(receiver, app)
    try:
        assert client.post("/double", json=2).get_json() == 4
        assert client.post("/boom").status_code == 500
    finally:
        flask.request_tearing_down.disconnect(receiver)  # from every sender: no receiver left for later tests
    assert sent == [(app, "/double", "None"), (app, "/boom", "RuntimeError('boom')")]


def test_an_app_class_that_overrides_the_teardown_keeps_it(closing_app):
    seen: List[Optional[str]] = []

    class Overriding(CountingFlask):
        def do_teardown_request(self, *args: Any, **kwargs: Any) -> None:
            seen.append(request.endpoint)
            super().do_teardown_request(*args, **kwargs)

    app, _ = made(closing_app, Overriding)
    client = app.test_client()
    for i in range(2):
        assert client.post("/double", json=i).get_json() == 2 * i
    assert seen == ["double"] * 2


@pytest.mark.parametrize("hooked", ["outer", "inner"])
def test_hooks_of_each_blueprint_run_for_a_route_of_a_nested_one(closing_app, hooked):
    """The route's blueprint and every one it is nested in: each one's hooks
    alone keep the route on Flask's dispatch."""
    calls: List[str] = []
    app = closing_app(CountingFlask(f"dispatch_nested_{hooked}"))
    streamer = FlaskStreamer()
    blueprints = {name: Blueprint(name, __name__, url_prefix=f"/{name}") for name in ("outer", "inner")}
    streamer.add_batched_route("/double", model=double, blueprint=blueprints["inner"])
    streamer.init_app(app)
    blueprints[hooked].after_request(lambda response: calls.append(f"{hooked} {request.blueprint}") or response)
    blueprints["outer"].register_blueprint(blueprints["inner"])
    app.register_blueprint(blueprints["outer"])
    client = app.test_client()
    for i in range(3):
        assert client.post("/outer/inner/double", json=i).get_json() == 2 * i
    assert calls == [f"{hooked} outer.inner"] * 3


def test_a_route_of_the_app_matched_before_the_batched_one_is_the_one_served(closing_app):
    app = closing_app(CountingFlask("dispatch_shadowed"))
    app.add_url_rule("/double", "mine", lambda: {"mine": True}, methods=["POST"])  # first: werkzeug's choice
    streamer = FlaskStreamer()
    streamer.add_batched_route("/double", model=double)
    streamer.init_app(app)
    client = app.test_client()
    for _ in range(3):
        assert client.post("/double", json=1).get_json() == {"mine": True}


def test_a_session_written_in_a_parse_hook_is_saved(closing_app):
    def parse(req: Any) -> Any:
        assert req.json_module is flask.current_app.json  # as Flask's request context sets it
        session["seen"] = session.get("seen", 0) + 1
        return req.get_json()

    app, _ = made(closing_app, config={"SECRET_KEY": "not a secret"}, parse=parse)
    client = app.test_client()
    for count in (1, 2, 3):
        response = client.post("/double", json=count)
        assert response.get_json() == 2 * count
        assert "session=" in response.headers.get("Set-Cookie", "")
        with client.session_transaction() as kept:
            assert kept["seen"] == count


class Teapot(Exception):
    """An error an app has its own handler for."""


def test_an_error_the_view_raises_goes_to_the_apps_handler_for_it(closing_app, monkeypatch):
    app, streamer = made(closing_app)
    app.register_error_handler(Teapot, lambda exc: ({"teapot": str(exc)}, 418))
    client = app.test_client()
    assert client.post("/double", json=1).get_json() == 2  # the first request: the routes matched

    def raising(route: Any) -> Any:
        raise Teapot("short and stout")

    monkeypatch.setattr(streamer, "serve_request", raising)
    response = client.post("/double", json=1)
    assert (response.status_code, response.get_json()) == (418, {"teapot": "short and stout"})


@needs_shortcut("flask-dispatch")
def test_an_app_mounted_under_a_prefix_is_matched_once_there_too(closing_app):
    from werkzeug.middleware.dispatcher import DispatcherMiddleware

    app, _ = made(closing_app)
    app.wsgi_app = DispatcherMiddleware(lambda environ, start: [], {"/api": app.wsgi_app})  # type: ignore[method-assign]
    client = app.test_client()
    for i in range(3):
        assert client.post("/api/double", json=i).get_json() == 2 * i
    assert bound(app) == 1, "PATH_INFO under the mount is the route's: werkzeug matched it at the first request only"


def test_a_route_with_variables_gets_them_from_werkzeug_even_for_its_own_text(closing_app):
    seen: List[Any] = []

    def parse(req: Any) -> Any:
        seen.append(req.view_args)
        return req.get_json()

    app = closing_app(CountingFlask("dispatch_variables"))
    streamer = FlaskStreamer()
    streamer.add_batched_route("/embed/<kind>", "embed", double, parse=parse)
    streamer.init_app(app)
    client = app.test_client()
    for path in ("/embed/<kind>", "/embed/text", "/embed/<kind>"):
        assert client.post(path, json=1).get_json() == 2
    assert seen == [{"kind": "<kind>"}, {"kind": "text"}, {"kind": "<kind>"}]


def test_after_this_request_acts_without_a_session(closing_app):
    def parse(req: Any) -> Any:
        @after_this_request
        def tag(response: Any) -> Any:
            response.headers["X-This-Request"] = str(req.get_json())
            return response

        return req.get_json()

    app, _ = made(closing_app, parse=parse)  # no SECRET_KEY: the null session
    client = app.test_client()
    for i in range(3):
        response = client.post("/double", json=i)
        assert (response.get_json(), response.headers.get("X-This-Request")) == (2 * i, str(i))


@pytest.mark.parametrize("off", ["setting", "release"])
def test_with_its_shortcut_off_every_request_is_dispatched_and_answered_by_flask(closing_app, monkeypatch, caplog, off):
    """``STREAMER_SHORTCUTS = False``, or a Flask and a werkzeug outside the
    releases the shortcuts are tested on: werkzeug matches every request
    and Flask's own response class answers; the app's line says why."""
    from streamer_core import shortcuts

    monkeypatch.delenv("STREAMER_SHORTCUTS", raising=False)
    config = {}
    if off == "setting":
        config["STREAMER_SHORTCUTS"] = False
    else:
        for name in ("flask-dispatch", "flask-answer"):
            monkeypatch.setitem(shortcuts.SHORTCUTS, name, shortcuts.SHORTCUTS[name]._replace(below=(1,)))
    with caplog.at_level(logging.INFO, "streamer_core.shortcuts"):
        app, _ = made(closing_app, config=config)
    kinds: List[type] = []
    app.after_request(lambda response: kinds.append(type(response)) or response)
    client = app.test_client()
    first = bound(app)
    for i in range(3):
        assert client.post("/double", json=i).get_json() == 2 * i
    assert bound(app) == first + 3, "werkzeug matches each request"
    assert kinds == [flask.Response] * 3
    (record,) = [r for r in caplog.records if r.name == "streamer_core.shortcuts"]
    why = "(STREAMER_SHORTCUTS is False)" if off == "setting" else " is newer than the 3.0 to 0.x it is tested on"
    assert record.getMessage().startswith(f"{app.name}: shortcuts through other packages' private workings: on: ")
    assert "flask-dispatch" in record.getMessage().split("; off, ")[1] and why in record.getMessage()
    assert record.levelno == (logging.INFO if off == "setting" else logging.WARNING)
