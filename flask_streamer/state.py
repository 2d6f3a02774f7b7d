"""What flask_streamer keeps for each app it is set up on, in
``app.extensions["streamer"]``: its checked settings, its request cycle and
its batched routes' streamers (:class:`AppState`, :func:`state_of`)."""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Protocol

from flask import Flask, current_app, jsonify

from streamer_core import shortcuts
from streamer_core.options.config import OPTIONS
from streamer_core.web.cycle import Cycle
from streamer_core.web.deadline import EndpointDeadline
from streamer_core.web.spec import LazyStreamer

from .decorators import explained
from .reading import read_error
from .route import BatchedRoute
from .settings import BODY_DEFAULTS, setting_name, written_as

__all__ = ["EXTENSION_KEY", "SHORTCUTS", "AppState", "state_of", "reply"]

EXTENSION_KEY = "streamer"

#: The shortcuts (:mod:`streamer_core.shortcuts`) an app's batched routes may take, as its boot line lists them.
SHORTCUTS = (
    "flask-dispatch",
    "flask-answer",
    "gevent-reading",
    "gevent-writing",
    "gunicorn-access-log",
    "otel-spans",
    "redis-packing",
)


class Extension(Protocol):
    """What the state asks of the :class:`~flask_streamer.FlaskStreamer` it belongs to."""

    def routes(self, app: Optional[Flask] = None) -> List[BatchedRoute]: ...

    def start(self, app: Optional[Flask] = None, wait: bool = True, timeout: float = 120.0) -> None: ...


class AppState:
    """What the extension keeps in ``app.extensions["streamer"]``: the app's
    checked settings, its request cycle and, per route, its streamer
    (started on first use)."""

    def __init__(self, extension: Extension, app: Flask, settings: Dict[str, Any]) -> None:
        self.extension = extension
        self.settings = settings
        self.max_body_bytes: Optional[int] = app.config.get(
            setting_name("max_body_bytes"), BODY_DEFAULTS["max_body_bytes"]
        )
        self.max_inputs: int = app.config.get(setting_name("max_inputs"), BODY_DEFAULTS["max_inputs"])
        #: ``STREAMER_JSON_ERRORS``: every HTTP error of the app as JSON.
        self.json_errors: bool = app.config.get(setting_name("json_errors"), OPTIONS["json_errors"].default)
        #: ``STREAMER_SHORTCUTS``: the app's own switch of :mod:`streamer_core.shortcuts`.
        self.shortcuts: bool = app.config.get(setting_name("shortcuts"), OPTIONS["shortcuts"].default)
        self.shortcuts_name = written_as(setting_name("shortcuts"), app.config)
        #: Whether a batched route's default JSON answer is sent as :class:`JsonAnswer`.
        self.quick_answer = shortcuts.allowed("flask-answer", self.shortcuts)
        self.handles: Dict[BatchedRoute, LazyStreamer] = {}
        #: ``STREAMER_TIMEOUT_HEADER``, ``STREAMER_ENVOY_TIMEOUT``: where a request says its deadline.
        self.timeout_header: Any = app.config.get(setting_name("timeout_header"), OPTIONS["timeout_header"].default)
        self.envoy_timeout: Any = app.config.get(setting_name("envoy_timeout"), OPTIONS["envoy_timeout"].default)
        self._deadlines: Dict[BatchedRoute, EndpointDeadline] = {}
        #: Set by :meth:`FlaskStreamer.drain`: new calls get 503, readiness too.
        self.draining = False
        #: ``STREAMER_ERROR_DETAILS``: a 500 says its exception (None: in debug mode).
        self.error_details: Optional[bool] = app.config.get(setting_name("error_details"))
        self.cycle: Cycle[Any] = _FlaskCycle(reply, app.logger, "the batched route", _debug, read_error, _details)

    def deadline(self, route: BatchedRoute) -> EndpointDeadline:
        """Where a request to ``route`` says its deadline: the route's own
        ``timeout_header`` and ``envoy_timeout``, else the app's."""
        found = self._deadlines.get(route)
        if found is None:
            given = route.deadline_options
            header = given.get("timeout_header", self.timeout_header)
            envoy = given.get("envoy_timeout", self.envoy_timeout)
            found = self._deadlines[route] = EndpointDeadline.checked(
                header, envoy, f"the batched route {route.rule!r}"
            )
        return found

    def handle(self, route: BatchedRoute) -> LazyStreamer:
        handle = self.handles.get(route)
        if handle is None:
            raise RuntimeError(
                f"the batched route {route.name} belongs to a FlaskStreamer that this app was not set up with: "
                "call init_app(app) on the FlaskStreamer that declared it"
            )
        return handle


class _FlaskCycle(Cycle[Any]):
    """The request cycle, with Flask's error for a model that needs a
    request told as what it is: a view decorator on the batch function
    (:func:`~flask_streamer.decorators.explained`)."""

    def error(
        self, name: str, exc: BaseException, failed_input: Optional[int] = None, span: Optional[Any] = None
    ) -> Any:
        return super().error(name, explained(exc, f"{self.noun} {name}"), failed_input, span)


def state_of(app: Flask) -> AppState:
    """What flask_streamer keeps for ``app`` (its settings, request cycle and
    routes' streamers); ``RuntimeError`` where it is not set up on it."""
    try:
        state: AppState = app.extensions[EXTENSION_KEY]
    except KeyError:
        raise RuntimeError(
            f"flask_streamer is not set up on the app {app.name!r}: call FlaskStreamer(app) or streamer.init_app(app)"
        ) from None
    return state


def reply(status: int, body: Dict[str, Any], headers: Dict[str, str]) -> Any:
    """A JSON answer, as the request cycle and the probes give it."""
    return jsonify(body), status, headers


def _debug() -> bool:
    return bool(current_app.debug)


def _details() -> Optional[bool]:
    """``STREAMER_ERROR_DETAILS`` of the current app (``None``: as its debug mode)."""
    details: Optional[bool] = current_app.extensions[EXTENSION_KEY].error_details
    return details
