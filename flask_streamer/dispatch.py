"""A batched route's request, dispatched by Flask without the work that
changes nothing for it.

For every request Flask binds werkzeug's URL map to the request's
environment and matches its path against every rule, then runs the request
signals, the ``before_request`` and ``after_request`` functions and the URL
value preprocessors, most of them empty. Profiled under load (the example,
its forward pass stubbed), that came to as much of the web process's busy
CPU as the batching itself. A batched route's path is one fixed
string, so werkzeug's answer for it can be asked once and kept, and what an
app registers for it can be looked at, not called.

:func:`install` gives the app three callables in place of its methods of the
same name, as a subclass would override them:

- ``request_context(environ)``: for a request whose path and method are one
  of the app's batched routes' (as werkzeug matched them once, at the app's
  first request, after which Flask lets no route be added), a
  :class:`RouteContext`, Flask's request context with that match already
  made and the URL adapter bound only if something asks for it (``url_for``);
  any other request gets Flask's own;
- ``full_dispatch_request()``: for such a request, with no receiver of the
  ``request_started`` or ``request_finished`` signals and no ``before_request``,
  ``after_request`` or URL value preprocessor function of the app or the
  route's blueprints, calls the route's view (the one the app registered,
  its ``decorators=`` applied), then Flask's ``handle_user_exception``,
  ``make_response`` and (for ``after_this_request`` functions and a session
  that is not the null one) ``process_response`` as Flask would; anything
  else goes through Flask's own;
- ``do_teardown_request(exc)``, for any request: Flask's, where a
  ``teardown_request`` function of the app or any blueprint, or a receiver of
  the ``request_tearing_down`` signal, is set; where none is, nothing (Flask's
  would walk the request's blueprints to find none, and send a signal no one
  receives).

Everything else is Flask's: its ``wsgi_app``, the contexts' push and pop
(the session opened, the app context's teardown), its error handling.
Nothing is installed where the app's class overrides one of the methods
this leans on, and nothing is taken over where the app trusts only some
hosts (``TRUSTED_HOSTS``, checked when the URL adapter is bound), matches
hosts or subdomains, or where this Flask's request context is not laid out
as :class:`RouteContext` expects (checked once, against one Flask makes).
"""

from __future__ import annotations

import logging
from typing import Any, Callable, Dict, Iterable, Optional, Tuple

from flask import Flask, request_finished, request_started, request_tearing_down
from flask.ctx import RequestContext
from flask.globals import request_ctx
from werkzeug.exceptions import HTTPException
from werkzeug.routing import Rule
from werkzeug.test import EnvironBuilder

__all__ = ["RouteContext", "install"]

logger = logging.getLogger("flask_streamer")

#: The app's methods this module replaces or relies on: an app whose class
#: overrides one of them keeps Flask's dispatch for every request.
FLASK_METHODS = (
    "request_context",
    "create_url_adapter",
    "full_dispatch_request",
    "preprocess_request",
    "dispatch_request",
    "finalize_request",
    "make_response",
    "process_response",
    "do_teardown_request",
)

#: Where this Flask's request context keeps its session: ``_session`` behind
#: a property since Flask 3.1, the ``session`` attribute before.
_SESSION = "_session" if isinstance(vars(RequestContext).get("session"), property) else "session"

#: A route's key: the request's ``PATH_INFO`` and method.
Key = Tuple[str, str]


class _LazyAdapter:
    """The request's URL adapter, bound by Flask's ``create_url_adapter`` on
    the first use of one of its attributes (``url_for`` building a URL)."""

    __slots__ = ("_app", "_request", "_bound")

    def __init__(self, app: Flask, request: Any) -> None:
        self._app = app
        self._request = request
        self._bound: Any = None

    def __getattr__(self, name: str) -> Any:
        if self._bound is None:
            self._bound = self._app.create_url_adapter(self._request)
        return getattr(self._bound, name)

    def __repr__(self) -> str:
        return f"<URL adapter, {'bound' if self._bound is not None else 'not bound yet'}>"


class RouteContext(RequestContext):
    """Flask's request context for a request to a batched route whose match
    is known: what Flask's ``__init__`` sets, the URL adapter bound on first
    use, and ``match_request`` (the hook Flask documents for subclasses)
    setting the route's rule without asking werkzeug."""

    def __init__(self, app: Flask, environ: Dict[str, Any], route: _Route) -> None:  # noqa: D107
        # Not RequestContext.__init__: it binds the URL map, which is what
        # this context saves. The same attributes (checked by _lays_out_as_flask).
        request = app.request_class(environ)
        request.json_module = app.json
        self.app = app
        self.request = request
        self.url_adapter = _LazyAdapter(app, request)  # type: ignore[assignment]
        self.flashes = None
        setattr(self, _SESSION, None)
        self._after_request_functions = []
        self._cv_tokens = []
        self._route = route

    def match_request(self) -> None:
        self.request.url_rule = self._route.rule
        self.request.view_args = {}

    def copy(self) -> RequestContext:
        """Flask's own copy (``copy_current_request_context``): a request
        context of Flask's class, of the same request and session."""
        return RequestContext(self.app, self.request.environ, request=self.request, session=getattr(self, _SESSION))


class _Route:
    """One batched route's rule as werkzeug matched it, its view, and the
    app's and blueprints' names whose hooks would run for it."""

    __slots__ = ("rule", "view", "names")

    def __init__(self, rule: Rule, view: Callable[..., Any]) -> None:
        self.rule = rule
        self.view = view
        blueprints = rule.endpoint.rpartition(".")[0]
        parts = blueprints.split(".") if blueprints else []
        # As Flask's request.blueprints: the app (None), then each blueprint from the outermost.
        self.names: Tuple[Optional[str], ...] = (None, *(".".join(parts[: i + 1]) for i in range(len(parts))))


def install(app: Flask, views: Callable[[], Iterable[Callable[..., Any]]]) -> bool:
    """Give ``app`` the dispatch above for the batched routes whose view
    functions ``views()`` gives (asked once, at the app's first request).
    Returns whether it was installed (not where the app's class overrides
    one of :data:`FLASK_METHODS`)."""
    overridden = [name for name in FLASK_METHODS if getattr(type(app), name) is not getattr(Flask, name)]
    if overridden:
        logger.debug("%s overrides Flask's %s: its batched routes use Flask's dispatch", type(app).__name__, overridden)
        return False
    flasks_context = app.request_context
    flasks_dispatch = app.full_dispatch_request
    routes: Optional[Dict[Key, _Route]] = None

    def request_context(environ: Dict[str, Any]) -> RequestContext:
        nonlocal routes
        if routes is None:  # the first request: Flask lets no route be added after it
            routes = _matched_routes(app, set(views()), flasks_context)
        route = routes.get((environ.get("PATH_INFO", ""), environ.get("REQUEST_METHOD", ""))) if routes else None
        if route is None or "HTTP_UPGRADE" in environ:
            return flasks_context(environ)
        return RouteContext(app, environ, route)

    def full_dispatch_request() -> Any:
        ctx = request_ctx._get_current_object()  # type: ignore[attr-defined]
        if type(ctx) is not RouteContext or request_started.receivers or request_finished.receivers:
            return flasks_dispatch()
        route: _Route = ctx._route
        for name in route.names:
            if app.before_request_funcs.get(name) or app.after_request_funcs.get(name):
                return flasks_dispatch()
            if app.url_value_preprocessors.get(name):
                return flasks_dispatch()
        if app.view_functions.get(route.rule.endpoint) is not route.view:
            return flasks_dispatch()  # the view was replaced (wrapped) since
        app._got_first_request = True  # as Flask's: setting the app up is over (its setup methods refuse)
        rv: Any
        try:
            rv = route.view()
        except Exception as exc:
            rv = app.handle_user_exception(exc)
        response = app.make_response(rv)
        if ctx._after_request_functions or not app.session_interface.is_null_session(getattr(ctx, _SESSION)):
            response = app.process_response(response)
        return response

    flasks_teardown = app.do_teardown_request

    def do_teardown_request(*args: Any, **kwargs: Any) -> None:
        # Flask's walks the request's blueprints for teardown functions and
        # sends request_tearing_down, for every request: both, where there is
        # something to call.
        if request_tearing_down.receivers or any(app.teardown_request_funcs.values()):
            flasks_teardown(*args, **kwargs)

    app.request_context = request_context  # type: ignore[method-assign]
    app.full_dispatch_request = full_dispatch_request  # type: ignore[method-assign]
    app.do_teardown_request = do_teardown_request  # type: ignore[method-assign]
    return True


def _matched_routes(
    app: Flask, views: set[Callable[..., Any]], flasks_context: Callable[[Dict[str, Any]], RequestContext]
) -> Dict[Key, _Route]:
    """The batched routes' keys whose match werkzeug gives without looking at
    the host: each rule (in ASCII, as ``PATH_INFO`` gives it), each method
    but ``HEAD`` and ``OPTIONS``, that werkzeug matches to that rule with no
    variables (a rule with variables matches its own text with some). None
    where the host counts, or where this Flask's request context is not laid
    out as :class:`RouteContext` expects."""
    if app.config.get("TRUSTED_HOSTS") is not None or app.url_map.host_matching or app.subdomain_matching:
        return {}
    adapter = app.url_map.bind("localhost", subdomain=app.url_map.default_subdomain or "")
    found: Dict[Key, _Route] = {}
    for rule in app.url_map.iter_rules():
        view = app.view_functions.get(rule.endpoint)
        if view not in views or rule.websocket or not rule.rule.isascii():
            continue
        for method in sorted(rule.methods or ()):
            if method in ("HEAD", "OPTIONS"):
                continue
            try:
                matched, values = adapter.match(rule.rule, method, return_rule=True)
            except HTTPException:
                continue  # a redirect, or another rule's 405
            if matched is rule and not values:
                found[(rule.rule, method)] = _Route(rule, view)
    if found and not _lays_out_as_flask(app, next(iter(found.items())), flasks_context):
        logger.debug("this Flask's request context is not laid out as flask_streamer expects: Flask dispatches")
        return {}
    return found


def _lays_out_as_flask(
    app: Flask, item: Tuple[Key, _Route], flasks_context: Callable[[Dict[str, Any]], RequestContext]
) -> bool:
    """Whether a :class:`RouteContext` has the attributes Flask's own request
    context has, for one request to a batched route, with the same values
    but the request and its URL adapter (their own objects either way): a
    Flask that changes its context's layout keeps its own dispatch."""
    (path, method), route = item
    environ = EnvironBuilder(path=path, method=method).get_environ()
    flasks = flasks_context(environ)
    ours = RouteContext(app, environ, route)
    own = ("request", "url_adapter")
    theirs = {name: value for name, value in vars(flasks).items() if name not in own}
    mine = {name: value for name, value in vars(ours).items() if name not in own and name != "_route"}
    return type(flasks) is RequestContext and theirs == mine
