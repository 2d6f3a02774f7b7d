"""How a request to a batched route is served: its input read (the route's
``parse`` hook or the default rule), its call put through the app's
request cycle (:class:`~streamer_core.web.cycle.Cycle`: queued with other
requests' inputs, timed by its deadline headers, at its priority level)
and its output answered (the route's ``respond`` hook or JSON).

:meth:`FlaskStreamer.serve_request <flask_streamer.FlaskStreamer.serve_request>`,
which every batched route's view calls, hands the request here.
"""

from __future__ import annotations

from typing import Any, Optional

from flask import Flask, Request, Response, current_app, request
from flask.json.provider import DefaultJSONProvider

from streamer_core.web.body import default_input
from streamer_core.web.deadline import environ_headers
from streamer_core.web.http import FAST_JSON, json_answer, to_jsonable
from streamer_core.web.peer import client_socket

from .answer import JsonAnswer
from .reading import body_of, limit_request_body, loads_of
from .route import UNSET, BatchedRoute
from .state import EXTENSION_KEY, state_of

__all__ = ["serve", "read_input", "answer_json"]


def serve(route: BatchedRoute) -> Any:
    """The answer to the current request to ``route``, a batched route of
    the current app: its output, or the JSON error of what went wrong."""
    app = current_app._get_current_object()  # type: ignore[attr-defined]
    req = request._get_current_object()  # type: ignore[attr-defined]
    state = state_of(app)
    limit = state.max_body_bytes if route.max_body_bytes is UNSET else route.max_body_bytes
    most = (state.max_inputs if route.max_inputs is UNSET else route.max_inputs) if route.many else None
    handle = state.handle(route)
    # Traced, the request's span is named by its route as Flask matched it ("POST /embed/<kind>").
    rule = req.url_rule
    traced = (req.method, rule.rule if rule is not None else req.path) if handle.spec.config.tracing else None
    priority, config = route.priority, handle.spec.config
    level = (
        (lambda: priority.level(priority.header and req.headers.get(priority.header), config))
        if priority.given
        else None
    )
    deadline = state.deadline(route)
    timed = (lambda at: deadline.timeout(environ_headers(req.environ), config, at)) if deadline.reads else None
    return state.cycle.serve(
        route.name,
        handle.get,
        lambda: read_input(route, req, app, limit),
        lambda output: route.respond(output) if route.respond is not None else answer_json(app, output),
        state.draining,
        most,
        traced,
        client_socket(req.environ),
        level,
        timed,
    )


def answer_json(app: Flask, output: Any) -> Any:
    """The model's output as the JSON response: written by orjson where it is
    installed and the app keeps Flask's own JSON provider (arrays and
    tensors as they are, see :func:`~streamer_core.web.http.dumps_json`),
    else by the app's provider. An output with no JSON form is a
    :class:`~streamer_core.errors.SerializationError` (500)."""
    if FAST_JSON and type(app.json) is DefaultJSONProvider:
        # Flask's own response class, sent more cheaply (JsonAnswer) where that shortcut is on; an app's own is kept.
        kind = app.response_class
        if kind is Response and app.extensions[EXTENSION_KEY].quick_answer:
            kind = JsonAnswer
        return kind(json_answer(output), mimetype="application/json")
    return json_answer(output, lambda value: app.json.response(to_jsonable(value)))


def read_input(route: BatchedRoute, req: Request, app: Flask, max_bytes: Optional[int]) -> Any:
    """The request's model input, by the route's ``parse`` hook or the
    default rule; what goes wrong is the cycle's to answer (see
    :func:`~flask_streamer.reading.read_error`)."""
    limit = limit_request_body(req, app, max_bytes)
    if route.parse is not None:
        return route.parse(req)
    return default_input(body_of(req), route.field, limit, loads_of(app), route.many)
