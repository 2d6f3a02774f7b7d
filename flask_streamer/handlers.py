"""What :meth:`FlaskStreamer.init_app <flask_streamer.FlaskStreamer.init_app>`
adds to an app beside its batched routes: the operations routes
(``STREAMER_METRICS_ROUTE``, ``STREAMER_HEALTH_ROUTE``,
``STREAMER_READY_ROUTE``), the error handlers that answer a batched
route's 405 (and, with ``STREAMER_JSON_ERRORS``, every HTTP error) as
JSON, and the ``flask streamer`` commands.
"""

from __future__ import annotations

from typing import Any, Dict

import werkzeug.exceptions
from flask import Flask, Response, current_app, jsonify, request
from werkzeug.exceptions import HTTPException

from streamer_core.errors import MethodNotAllowed
from streamer_core.telemetry.metrics import exposition
from streamer_core.web.http import error_body
from streamer_core.web.probes import liveness, readiness

from .state import AppState, reply, state_of

__all__ = ["register"]


def register(app: Flask, state: AppState, ops_routes: Dict[str, str]) -> None:
    """Add to ``app`` its error handlers, the operations routes of
    ``ops_routes`` (a setting's field, as ``"metrics_route"``, to its URL
    rule) and the ``flask streamer`` commands."""
    app.register_error_handler(werkzeug.exceptions.MethodNotAllowed, _method_not_allowed)
    if state.json_errors:
        app.register_error_handler(HTTPException, _json_http_error)
    views = {"metrics_route": _metrics_view, "health_route": _health_view, "ready_route": _ready_view}
    for field, rule in ops_routes.items():
        app.add_url_rule(rule, f"streamer_{field[: -len('_route')]}", views[field], methods=["GET"])
    from .cli import streamer_cli

    if streamer_cli.name not in app.cli.commands:
        app.cli.add_command(streamer_cli)


def _metrics_view() -> Any:
    body, content_type = exposition()
    return Response(body, content_type=content_type)


def _health_view() -> Any:
    return reply(*liveness())


def _ready_view() -> Any:
    app = current_app._get_current_object()  # type: ignore[attr-defined]
    state = state_of(app)
    handles = {route.name: state.handles[route] for route in state.extension.routes(app)}
    return reply(*readiness(handles, state.draining))


def _method_not_allowed(exc: werkzeug.exceptions.MethodNotAllowed) -> Any:
    """A 405 from the URL map: the project's JSON error for a batched
    route's path, Flask's own answer for any other."""
    app = current_app._get_current_object()  # type: ignore[attr-defined]
    allowed = sorted(exc.valid_methods or ())
    try:
        endpoint, _ = app.create_url_adapter(request).match(method=allowed[0]) if allowed else (None, None)
    except HTTPException:
        endpoint = None
    state = state_of(app)
    batched = endpoint is not None and endpoint in {route.name for route in state.handles}
    if not batched and not state.json_errors:
        return exc
    return state.cycle.error(endpoint or request.path, MethodNotAllowed(request.method, allowed))


def _json_http_error(exc: HTTPException) -> Any:
    """With ``STREAMER_JSON_ERRORS``: any HTTP error of the app (an unknown
    path's 404, a 413 werkzeug raised, a 500 of a view's bug, logged by
    Flask) answered as JSON, in the batched routes' shape."""
    status = exc.code or 500
    body = error_body(status, type(exc).__name__, exc.description or exc.name)
    headers = {name: value for name, value in exc.get_headers() if name.lower() not in ("content-type",)}
    return jsonify(body), status, headers
