"""View decorators on batched routes (``decorators=[...]``), with the real
extensions a Flask developer protects a route with: flask-httpauth,
flask-login, flask-limiter and flask-cors. A decorator's own answer comes
before the body is read or anything is queued; decorators apply in Flask's
``View.decorators`` order; a view decorator put on the batch function is
refused where it can be told, and otherwise fails with an error that names
``decorators=``, not Flask's context text."""

from __future__ import annotations

import functools
import logging
from typing import Any, Callable, Dict, List, Tuple

import pytest
from flask import Blueprint, Flask, current_app, request, url_for
from flask.views import View
from flask_cors import cross_origin
from flask_httpauth import HTTPTokenAuth
from flask_limiter import Limiter
from flask_limiter.util import get_remote_address
from flask_login import LoginManager, UserMixin, login_required

from flask_streamer import FlaskStreamer
from streamer_core.telemetry.stats import stats_for
from tests.flask.apps import double
from tests.flask.conftest import close_streamers, error_of
from tests.helpers import failure_behind

TOKEN = {"Authorization": "Bearer secret"}


def token_auth() -> HTTPTokenAuth:
    """flask-httpauth's bearer-token auth: ``secret`` is the one token."""
    auth = HTTPTokenAuth(scheme="Bearer")
    auth.verify_token(lambda token: "alice" if token == "secret" else None)
    return auth


class Counted:
    """A batch function doubling its inputs, and a parse hook, each counting its calls."""

    def __init__(self) -> None:
        self.batches: List[List[Any]] = []
        self.parsed = 0

    def __call__(self, batch: List[Any]) -> List[Any]:
        self.batches.append(list(batch))
        return [x * 2 for x in batch]

    def parse(self, req: Any) -> Any:
        self.parsed += 1
        return req.get_json()


def requests_of(name: str) -> Dict[str, int]:
    """The calls the route ``name``'s streamer counted, by outcome."""
    return dict(stats_for(name).snapshot().requests)


def refused_untouched(app: Flask, model: Counted, name: str, send: Callable[[], Any], status: int) -> Any:
    """``send()`` answered ``status`` by a decorator: the body never parsed,
    the model never called, no call counted."""
    counted = requests_of(name)
    response = send()
    assert response.status_code == status, response.get_data(as_text=True)
    assert (model.parsed, model.batches) == (0, []), "the request was read or queued"
    assert requests_of(name) == counted
    return response


# -- flask-httpauth -----------------------------------------------------------


@pytest.mark.parametrize("many", [False, True])
def test_flask_httpauth_refuses_a_request_without_its_token_before_reading_it(make_app, many):
    app, streamer = make_app()
    auth, model = token_auth(), Counted()
    streamer.add_batched_route(
        "/double", "double", model, parse=model.parse, many=many, decorators=[auth.login_required]
    )
    client = app.test_client()
    one, two = ([3], [3, 4]) if many else (3, 3)
    for _ in range(2):  # the app's first request, then the ones after it
        response = refused_untouched(app, model, "double", lambda: client.post("/double", json=one), 401)
        assert response.get_data() == b"Unauthorized Access"  # flask-httpauth's own answer
        assert response.headers["WWW-Authenticate"] == 'Bearer realm="Authentication Required"'
        assert client.post("/double", json=one, headers={"Authorization": "Bearer wrong"}).status_code == 401
    assert (model.parsed, model.batches) == (0, [])
    assert client.post("/double", json=two, headers=TOKEN).get_json() == ([6, 8] if many else 6)
    assert model.parsed == 1


def test_a_route_on_a_blueprint_is_protected_there(make_app):
    app, streamer = make_app()
    auth, model = token_auth(), Counted()
    bp = Blueprint("v1", __name__, url_prefix="/v1")
    streamer.add_batched_route("/double", "double", model, blueprint=bp, decorators=[auth.login_required])
    app.register_blueprint(bp)
    client = app.test_client()
    refused_untouched(app, model, "v1.double", lambda: client.post("/v1/double", json=2), 401)
    assert client.post("/v1/double", json=2, headers=TOKEN).get_json() == 4
    with app.app_context():
        assert [route.name for route in streamer.routes()] == ["v1.double"]


def test_a_route_serving_anothers_model_has_its_own_decorators(make_app):
    """``model="embed"``: the queue and settings are shared, the view's decorators are not."""
    app, streamer = make_app()
    auth, model = token_auth(), Counted()
    streamer.add_batched_route("/double", "double", model, decorators=[auth.login_required])
    streamer.add_batched_route("/open", "open", model="double")
    streamer.add_batched_route("/also", "also", model="double", decorators=[auth.login_required])
    client = app.test_client()
    assert client.post("/double", json=1).status_code == 401
    assert client.post("/also", json=1).status_code == 401
    assert client.post("/open", json=1).get_json() == 2
    assert client.post("/also", json=1, headers=TOKEN).get_json() == 2


def test_the_streamers_decorators_are_every_routes_that_gives_none(make_app):
    """``FlaskStreamer(decorators=...)``: each route gets them, unless it
    gives its own list, which replaces them (``[]``: none)."""
    auth = token_auth()
    app = Flask("decorators_streamer_wide")
    streamer = FlaskStreamer(decorators=[auth.login_required])
    seen: List[str] = []

    def mark(view: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(view)
        def marked(*args: Any, **kwargs: Any) -> Any:
            seen.append(request.path)
            return view(*args, **kwargs)

        return marked

    bp = Blueprint("v1", __name__, url_prefix="/v1")
    streamer.add_batched_route("/double", model=double)
    streamer.add_batched_route("/double", model=double, blueprint=bp)
    streamer.add_batched_route("/public", "public", double, decorators=[])
    streamer.add_batched_route("/marked", "marked", double, decorators=[mark])
    streamer.init_app(app)
    app.register_blueprint(bp)
    try:
        client = app.test_client()
        assert client.post("/double", json=1).status_code == 401
        assert client.post("/v1/double", json=1).status_code == 401
        assert client.post("/double", json=1, headers=TOKEN).get_json() == 2
        assert client.post("/public", json=1).get_json() == 2
        assert client.post("/marked", json=1).get_json() == 2, "its own list replaces the streamer's"
        assert seen == ["/marked"]
    finally:
        close_streamers(app)


# -- flask-login --------------------------------------------------------------


class User(UserMixin):
    def __init__(self, name: str) -> None:
        self.id = name


def login_app(make_app: Callable[..., Tuple[Flask, FlaskStreamer]], login_view: bool) -> Tuple[Flask, Counted]:
    """An app whose ``/double`` needs flask-login's login: an ``X-Token:
    secret`` header logs a request in; with ``login_view``, one not logged
    in is sent to ``/login``."""
    app, streamer = make_app({"SECRET_KEY": "not a secret"})
    manager = LoginManager(app)
    manager.request_loader(lambda req: User("alice") if req.headers.get("X-Token") == "secret" else None)
    if login_view:
        app.add_url_rule("/login", "login", lambda: "log in here")
        manager.login_view = "login"
    model = Counted()
    streamer.add_batched_route("/double", "double", model, parse=model.parse, decorators=[login_required])
    return app, model


def test_flask_login_answers_401_to_a_request_not_logged_in(make_app):
    app, model = login_app(make_app, login_view=False)
    client = app.test_client()
    for _ in range(2):
        refused_untouched(app, model, "double", lambda: client.post("/double", json=5), 401)
    assert client.post("/double", json=5, headers={"X-Token": "secret"}).get_json() == 10


def test_flask_login_redirects_a_request_not_logged_in_to_its_login_view(make_app):
    app, model = login_app(make_app, login_view=True)
    client = app.test_client()
    response = refused_untouched(app, model, "double", lambda: client.post("/double", json=5), 302)
    assert response.headers["Location"] == "/login?next=%2Fdouble"
    assert client.post("/double", json=5, headers={"X-Token": "secret"}).get_json() == 10


# -- flask-limiter ------------------------------------------------------------


@pytest.fixture
def limiter() -> Limiter:
    """flask-limiter by the client's address, counting in memory."""
    return Limiter(get_remote_address, storage_uri="memory://")


def test_flask_limiters_limit_is_counted_per_route_then_429(make_app, limiter):
    """Three routes, each with a limit of its own: the app's ``double``, a
    blueprint's ``double`` (the same endpoint name) and one serving the
    first's model; each answers 429 once past its own limit, and only
    then, before anything is read or queued."""
    app, streamer = make_app()
    model = Counted()
    bp = Blueprint("v1", __name__, url_prefix="/v1")
    routes = [
        ("/double", "double", None, model, 1),
        ("/v1/double", "double", bp, model, 2),
        ("/shared", "shared", None, "double", 3),
    ]
    for path, endpoint, blueprint, served, most in routes:
        rule = path[len("/v1") :] if blueprint is not None else path
        streamer.add_batched_route(
            rule, endpoint, served, blueprint=blueprint, parse=model.parse, decorators=[limiter.limit(f"{most}/minute")]
        )
    app.register_blueprint(bp)
    limiter.init_app(app)
    client = app.test_client()
    for path, _, blueprint, _, most in routes:
        name = "v1.double" if blueprint is not None else "double"
        assert [client.post(path, json=1).status_code for _ in range(most)] == [200] * most, path
        assert (model.parsed, len(model.batches)) == (most, most)
        model.parsed, model.batches = 0, []
        response = refused_untouched(app, model, name, lambda path=path: client.post(path, json=1), 429)
        assert f"{most} per 1 minute" in response.get_data(as_text=True)


def test_decorators_apply_in_flasks_order_the_last_outermost(make_app, limiter):
    """``[limiter.limit(...), auth.login_required]``: the login is the
    outer one, so requests it refuses never count against the limit."""
    app, streamer = make_app()
    auth = token_auth()
    streamer.add_batched_route("/double", model=double, decorators=[limiter.limit("1/minute"), auth.login_required])
    limiter.init_app(app)
    client = app.test_client()
    assert [client.post("/double", json=1).status_code for _ in range(3)] == [401] * 3
    assert client.post("/double", json=1, headers=TOKEN).get_json() == 2
    assert client.post("/double", json=1, headers=TOKEN).status_code == 429


def test_decorators_wrap_the_view_as_flasks_view_decorators_do(make_app):
    """The same list on a batched route and on a ``flask.views.View``: the
    decorators run in the same order, the last in the list first."""
    calls: List[str] = []

    def tag(name: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        def decorator(view: Callable[..., Any]) -> Callable[..., Any]:
            @functools.wraps(view)
            def tagged(*args: Any, **kwargs: Any) -> Any:
                calls.append(name)
                return view(*args, **kwargs)

            return tagged

        return decorator

    decorators = [tag("first"), tag("second"), tag("third")]

    class Tagged(View):
        methods = ["POST"]

    Tagged.decorators = decorators

    def dispatch_request(self: View) -> Any:
        calls.append("view")
        return "ok"

    Tagged.dispatch_request = dispatch_request  # type: ignore[method-assign]
    app, streamer = make_app()
    app.add_url_rule("/flasks", view_func=Tagged.as_view("flasks"))
    streamer.add_batched_route("/double", model=double, decorators=decorators)
    client = app.test_client()
    assert client.post("/flasks").get_data() == b"ok"
    flasks, calls[:] = list(calls), []
    assert client.post("/double", json=1).get_json() == 2
    assert calls == flasks[:-1] == ["third", "second", "first"]


# -- flask-cors ---------------------------------------------------------------


def test_flask_cors_cross_origin_answers_the_preflight_and_adds_its_headers(make_app):
    app, streamer = make_app()
    model = Counted()
    streamer.add_batched_route("/double", "double", model, parse=model.parse, decorators=[cross_origin()])
    streamer.add_batched_route("/plain", "plain", double)
    client = app.test_client()
    origin = {"Origin": "https://elsewhere.test"}
    preflight = {**origin, "Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": "Content-Type"}
    for _ in range(2):
        response = refused_untouched(app, model, "double", lambda: client.options("/double", headers=preflight), 200)
        assert response.headers["Access-Control-Allow-Origin"] == "https://elsewhere.test"
        assert "POST" in response.headers["Access-Control-Allow-Methods"]
        assert response.headers["Access-Control-Allow-Headers"].lower() == "content-type"
        response = client.post("/double", json=4, headers=origin)
        assert (response.get_json(), response.headers["Access-Control-Allow-Origin"]) == (8, "https://elsewhere.test")
        model.parsed, model.batches = 0, []
    assert "Access-Control-Allow-Origin" not in client.post("/plain", json=4, headers=origin).headers


# -- how a route's view is made -----------------------------------------------


def unwrapped(view: Callable[..., Any]) -> Callable[..., Any]:
    """A decorator without ``functools.wraps``: its view is named ``wrapper``."""

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        return view(*args, **kwargs)

    return wrapper


def test_a_decorator_without_functools_wraps_changes_no_endpoint_or_name(make_app):
    app, streamer = make_app()

    @streamer.batched_route("/double", decorators=[unwrapped])
    def doubled(batch: List[Any]) -> List[Any]:
        """Doubles each input."""
        return [x * 2 for x in batch]

    streamer.add_batched_route("/twice", "twice", double, decorators=[unwrapped])
    assert app.test_client().post("/double", json=2).get_json() == 4
    assert app.test_client().post("/twice", json=2).get_json() == 4
    view = app.view_functions["doubled"]
    assert (view.__name__, view.__qualname__, view.__module__, view.__doc__) == (
        "doubled",
        "doubled",
        __name__,
        "Doubles each input.",
    )
    with app.test_request_context():
        assert (url_for("doubled"), url_for("twice")) == ("/double", "/twice")
        assert [route.name for route in streamer.routes()] == ["doubled", "twice"]


def test_the_decorated_function_is_returned_unchanged(make_app):
    _, streamer = make_app()
    auth = token_auth()

    def doubled(batch: List[Any]) -> List[Any]:
        return batch

    assert streamer.batched_route("/double", decorators=[auth.login_required])(doubled) is doubled
    assert not hasattr(doubled, "__wrapped__")


@pytest.mark.parametrize(
    "decorators, message",
    [
        (token_auth().login_required, "must be a list of view decorators"),
        ("login_required", "must be a list of view decorators"),
        ([None], "must each be a view decorator"),
        ([lambda view: None], "returned None, not a view"),
    ],
)
def test_decorators_that_are_no_list_of_view_decorators_are_refused(make_app, decorators, message):
    app, streamer = make_app()
    with pytest.raises(TypeError, match=message):
        streamer.add_batched_route("/double", model=double, decorators=decorators)
    with pytest.raises(TypeError, match=message):  # the streamer's refused, or the route made with them
        FlaskStreamer(decorators=decorators).add_batched_route("/double", model=double)
    assert "double" not in app.view_functions


def test_a_decorator_above_batched_route_wraps_the_function_and_leaves_the_route_open(make_app):
    """The README's rule: above ``@batched_route`` a view decorator wraps
    the batch function that it returns, not the route."""
    app, streamer = make_app()
    auth = token_auth()

    @auth.login_required
    @streamer.batched_route("/double")
    def doubled(batch: List[Any]) -> List[Any]:
        return [x * 2 for x in batch]

    assert app.test_client().post("/double", json=2).get_json() == 4, "the route is served without a token"
    [route] = app.extensions["streamer"].handles
    assert doubled.__wrapped__ is route.model


# -- a view decorator on the batch function ------------------------------------


#: A limiter on no app, for the decorator below (which holds it only weakly).
UNUSED_LIMITER = Limiter(get_remote_address, storage_uri="memory://")

#: Each extension's view decorator, made when its test runs.
VIEW_DECORATORS: Dict[str, Callable[[], Callable[..., Any]]] = {
    "flask_httpauth": lambda: token_auth().login_required,
    "flask_login": lambda: login_required,
    "flask_limiter": lambda: UNUSED_LIMITER.limit("1/minute"),
    "flask_cors": lambda: cross_origin(),
}


@pytest.mark.parametrize("package", VIEW_DECORATORS)
def test_a_batch_function_under_an_extensions_view_decorator_is_refused(make_app, package):
    app, streamer = make_app()
    decorator = VIEW_DECORATORS[package]()

    def doubled(batch: List[Any]) -> List[Any]:
        return [x * 2 for x in batch]

    with pytest.raises(TypeError, match=rf"wrapped by a view decorator \({package}[.].*decorators=\[\.\.\.\]"):
        streamer.batched_route("/double")(decorator(doubled))

    def outer(function: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(function)
        def timed(batch: List[Any]) -> Any:
            return function(batch)

        return timed

    with pytest.raises(TypeError, match=package):  # under another wrapper too
        streamer.batched_route("/double")(outer(decorator(doubled)))
    assert "doubled" not in app.view_functions


def test_a_batch_function_under_other_wrappers_is_served(make_app, caplog):
    """Wrappers that set ``__wrapped__`` and need no request: one of the
    app's own, ``functools.lru_cache``, ``torch.no_grad()``, and
    flask-caching's ``memoize`` (a Flask extension's, that reads no request)."""
    from flask_caching import Cache

    torch = pytest.importorskip("torch")
    app, streamer = make_app()
    cache = Cache(app, config={"CACHE_TYPE": "SimpleCache"})
    memoized: List[List[Any]] = []

    @streamer.batched_route("/memoized")
    @cache.memoize()
    def remembered(batch: List[Any]) -> List[Any]:
        memoized.append(list(batch))
        return [x * 2 for x in batch]

    def logged(function: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(function)
        def logging_(batch: List[Any]) -> Any:
            return function(batch)

        return logging_

    @streamer.batched_route("/logged")
    @logged
    def doubled(batch: List[Any]) -> List[Any]:
        return [x * 2 for x in batch]

    @streamer.batched_route("/grad")
    @torch.no_grad()
    def grad(batch: List[Any]) -> List[Any]:
        return [torch.is_grad_enabled() for _ in batch]

    @streamer.batched_route("/cached")
    @functools.lru_cache(maxsize=8)
    def cached(batch: Any) -> Any:
        return [len(batch)] * len(batch)

    client = app.test_client()
    assert client.post("/logged", json=3).get_json() == 6
    assert client.post("/grad", json=3).get_json() is False
    failure = failure_behind(error_of(client.post("/cached", json=3), 500), caplog.records)
    assert type(failure) is TypeError  # a list is unhashable: its own error
    assert [client.post("/memoized", json=3).get_json() for _ in range(2)] == [6, 6]
    assert memoized == [[3]], "the second batch, the same, was the cache's"


def needs(what: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """A view decorator of an app's own (told at run time only): it reads
    the request's header, or the app's config."""

    def decorator(function: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(function)
        def checked(*args: Any, **kwargs: Any) -> Any:
            if what == "request" and request.headers.get("X-Key") != "k":
                return "refused", 403
            if what == "app" and not current_app.config.get("OPEN"):
                return "refused", 403
            return function(*args, **kwargs)

        return checked

    return decorator


@needs("request")
def guarded(batch: List[Any]) -> List[Any]:
    """A batch function under the app's own view decorator (at module level: the process backend imports it)."""
    return batch


@needs("app")
def configured(batch: List[Any]) -> List[Any]:
    return batch


@pytest.mark.parametrize("model, context", [(guarded, "request"), (configured, "application")])
def test_a_batch_function_that_needs_a_request_fails_naming_decorators(make_app, caplog, model, context):
    app, streamer = make_app()
    streamer.add_batched_route("/guarded", "guarded", model)
    with caplog.at_level(logging.ERROR):
        error = error_of(app.test_client().post("/guarded", json=1, headers={"X-Key": "k"}), 500)
    failure = failure_behind(error, caplog.records)
    assert type(failure) is RuntimeError
    assert str(failure) == (
        f"the model of the batched route guarded needs a request (Working outside of {context} context), but runs "
        "in a batch, apart from every request: a view decorator (login, rate limit, CORS) goes in the route's "
        "decorators=[...], not on the batch function"
    )
    assert "This typically means" in str(failure.__cause__), "Flask's own words kept, as the cause"


def test_an_error_that_only_reads_like_flasks_in_another_type_is_the_models_own(make_app, caplog):
    app, streamer = make_app()

    def failing(batch: List[Any]) -> List[Any]:
        raise ValueError("Working outside of request context, as I like it")

    streamer.add_batched_route("/failing", "failing", failing)
    failure = failure_behind(error_of(app.test_client().post("/failing", json=1), 500), caplog.records)
    assert (type(failure), str(failure)) == (ValueError, "Working outside of request context, as I like it")


def test_on_the_process_backend_decorators_protect_and_a_request_needed_is_told(make_app, caplog):
    """The workers import the batch function by name: the decorated
    route's function is the one declared, and the error of one under a
    view decorator crosses the process as the same explained error."""
    app, streamer = make_app(
        {"STREAMER_BACKEND": "process", "STREAMER_WORKER_NUM": 1, "STREAMER_MAX_LATENCY": 0.01, "STREAMER_TIMEOUT": 60}
    )
    streamer.add_batched_route("/double", model=double, decorators=[token_auth().login_required])
    streamer.add_batched_route("/guarded", "guarded", guarded)
    client = app.test_client()
    assert client.post("/double", json=1).status_code == 401
    assert client.post("/double", json=21, headers=TOKEN).get_json() == 42
    failure = failure_behind(error_of(client.post("/guarded", json=1, headers={"X-Key": "k"}), 500), caplog.records)
    assert type(failure) is RuntimeError and "decorators=[...]" in str(failure)
