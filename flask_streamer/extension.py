"""The Flask extension: :class:`FlaskStreamer` and its batched routes."""

from __future__ import annotations

import logging
import threading
import weakref
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence

from flask import Blueprint, Flask, current_app, request

from streamer_core import shortcuts
from streamer_core.options.config import OPTIONS
from streamer_core.streamer import BaseStreamer
from streamer_core.web.body import check_many
from streamer_core.web.deadline import EndpointDeadline
from streamer_core.web.priority import EndpointPriority
from streamer_core.web.spec import LazyStreamer, start_all

from . import handlers
from .decorators import ViewDecorator, check_batch_function, checked
from .dispatch import install as install_dispatch
from .inputs import json_body, request_inputs, request_item, request_upload
from .route import UNSET, BatchedRoute, ParseHook, RespondHook, check_sharing
from .serving import serve
from .settings import (
    ROUTE_OPTIONS,
    app_routes,
    check_ops_routes,
    read_settings,
)
from .state import EXTENSION_KEY, SHORTCUTS, AppState, state_of

__all__ = [
    "FlaskStreamer",
    "BatchedRoute",
    "json_body",
    "json_error",
    "request_inputs",
    "request_item",
    "request_upload",
    "start_streamers",
]

logger = logging.getLogger("flask_streamer")


class FlaskStreamer:
    """Dynamic batching for a Flask app: requests to a batched route are
    grouped into model calls of up to ``STREAMER_BATCH_SIZE`` inputs.

    ::

        app = Flask(__name__)
        app.config["STREAMER_BACKEND"] = "thread"
        streamer = FlaskStreamer(app)          # or FlaskStreamer(), then streamer.init_app(app)

        @streamer.batched_route("/stream", methods=["POST"], batch_size=64, max_latency=0.05)
        def stream(batch):                     # a list of inputs -> a list of outputs
            return model.predict(batch)

    Settings come from ``app.config`` (see :mod:`flask_streamer.settings`)
    and are checked by :meth:`init_app`. Each route has its own queue and its
    own streamer, started in each web process on its first request (or by
    :meth:`start`), never at import: importing the app in a worker process
    or a CLI command starts nothing.

    ``decorators``: the view decorators of every batched route declared on
    it that gives no ``decorators=`` of its own (see :meth:`batched_route`),
    as a base class's ``View.decorators`` are its subclasses'.
    """

    def __init__(self, app: Optional[Flask] = None, *, decorators: Sequence[ViewDecorator] = ()) -> None:
        self.decorators = checked(decorators, "FlaskStreamer")
        self._routes: List[BatchedRoute] = []
        self._apps: List[weakref.ref[Flask]] = []
        self._lock = threading.Lock()
        if app is not None:
            self.init_app(app)

    # -- set-up ----------------------------------------------------------------

    def init_app(self, app: Flask) -> None:
        """Read and check the app's ``STREAMER_*`` settings (raising
        :class:`ConfigurationError` that names every wrong one), register the
        batched routes declared so far, the operations routes, error handlers
        and ``flask streamer`` commands (:mod:`flask_streamer.handlers`)."""
        if EXTENSION_KEY in app.extensions:
            raise RuntimeError(
                f"flask_streamer is set up on the app {app.name!r} already: call init_app(app) once per app "
                "(one FlaskStreamer serves several apps, each set up once)"
            )
        settings = read_settings(app.config, app.name)
        ops_routes = {field: rule for field, rule in app_routes(app.config).items() if rule is not None}
        check_ops_routes(app, ops_routes)
        state = AppState(self, app, settings)
        for route in self._routes:
            self._attach(app, state, route)
        app.extensions[EXTENSION_KEY] = state
        handlers.register(app, state, ops_routes)
        with self._lock:
            self._apps.append(weakref.ref(app))
        if shortcuts.allowed("flask-dispatch", state.shortcuts):
            install_dispatch(app, lambda: [route.view for route in state.handles])
        shortcuts.say_which(SHORTCUTS, state.shortcuts, state.shortcuts_name, app.name)

    def batched_route(self, rule: str, **options: Any) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        """Decorate a batch function ``f(batch: list) -> list`` to serve it at
        ``rule``; each request gives one input and gets its own output.

        Options, all keyword: ``methods`` (default ``["POST"]``), ``endpoint``
        (default the function's name), ``blueprint`` (register on this
        blueprint rather than the app), the batching settings to override
        (``backend``, ``batch_size``, ``max_latency`` in seconds,
        ``worker_num``, ``cuda_devices``, ``timeout`` in seconds,
        ``max_queue``), ``field`` (the JSON key, form field or uploaded file
        holding the input, a file as ``bytes``; without it the input is the
        whole JSON body), ``max_body_bytes`` (the largest body read, else
        413; default ``STREAMER_MAX_BODY_BYTES``, 10 MiB), ``parse``
        (``parse(request) -> input``, raising :class:`InvalidInput` for a
        400) and ``respond`` (``respond(output) -> a Flask response``).

        ``many=True``: a request carries a list of inputs (a JSON array, or
        the array under ``field``; or every value or file of the form field
        ``field``; or what ``parse`` returns), at most ``max_inputs``
        (default ``STREAMER_MAX_INPUTS``, 2048; more is a 413 before anything
        is queued). Each input is one of the model's, costed, batched and
        counted against ``max_queue`` on its own, spread over batches and
        workers; ``respond`` gets the outputs, in order (by default a JSON
        array). The request's timeout covers them all; an input that fails
        fails the request with its index in the message (``"input"`` in the
        JSON error), and its inputs not yet run are dropped.

        ``priority``: the level of the route's requests; ``priority_header``
        (``True`` for ``X-Priority``, or a header's name): let a request
        choose its own by it (:mod:`streamer_core.web.priority`).

        ``timeout_header`` (default ``STREAMER_TIMEOUT_HEADER``,
        ``X-Request-Timeout``; ``None``: none) and ``envoy_timeout`` (default
        ``STREAMER_ENVOY_TIMEOUT``): the request headers a client says how
        long it will still wait in; its call's timeout is that, never more
        than the route's (:mod:`streamer_core.web.deadline`).

        ``decorators``: view decorators for the route's view, as Flask's
        ``View.decorators``: login (flask-httpauth's
        ``auth.login_required``, flask-login's ``login_required``), rate
        limits (flask-limiter's ``limiter.limit("10/minute")``, counted per
        route), CORS (flask-cors's ``cross_origin()``). Applied in Flask's
        order: each wraps the ones before it, so the first in the list is
        the innermost, the last the outermost. The request reaches the
        route only through them: a decorator's own answer (a 401, a 429, a
        redirect) is given before the body is read or anything is queued.
        Default: the :class:`FlaskStreamer`'s ``decorators``; ``[]``: none.
        A view decorator goes here, never on the batch function, which runs
        in a batch, apart from every request: under ``@batched_route`` it
        would fail every call (a Flask extension's is refused here, with
        ``TypeError``), above it it would wrap the function and leave the
        route unprotected.

        The function is returned unchanged, so the ``process`` and ``redis``
        backends' workers can import it by name.
        """

        def decorator(function: Callable[..., Any]) -> Callable[..., Any]:
            self.add_batched_route(rule, model=function, **options)
            return function

        return decorator

    def add_batched_route(
        self,
        rule: str,
        endpoint: Optional[str] = None,
        model: Any = None,
        *,
        methods: Iterable[str] = ("POST",),
        blueprint: Optional[Blueprint] = None,
        field: Optional[str] = None,
        parse: Optional[ParseHook] = None,
        respond: Optional[RespondHook] = None,
        init_args: Sequence[Any] = (),
        init_kwargs: Optional[Dict[str, Any]] = None,
        max_body_bytes: Any = UNSET,
        many: bool = False,
        max_inputs: Any = UNSET,
        priority: Optional[int] = None,
        priority_header: Any = False,
        decorators: Optional[Sequence[ViewDecorator]] = None,
        timeout_header: Any = UNSET,
        envoy_timeout: Any = UNSET,
        **overrides: Any,
    ) -> BatchedRoute:
        """Serve ``model`` at ``rule``: a batch function, or a
        :class:`~streamer_core.ManagedModel` subclass built with
        ``init_args``/``init_kwargs`` where it runs (in the web process for
        the thread backend, in each worker otherwise). Other options as for
        :meth:`batched_route`."""
        unknown = set(overrides) - set(ROUTE_OPTIONS)
        if unknown:
            raise TypeError(
                f"unknown option(s) {', '.join(sorted(unknown))} for the batched route {rule!r}; "
                f"a route may set {', '.join(ROUTE_OPTIONS)}, methods, endpoint, blueprint, field, parse, respond, "
                "init_args, init_kwargs, max_body_bytes, many, max_inputs, priority, priority_header, decorators, "
                "timeout_header and envoy_timeout"
            )
        if max_body_bytes is not UNSET:
            OPTIONS["max_body_bytes"].checked(max_body_bytes, f"max_body_bytes of the batched route {rule!r}")
        check_many(many, max_inputs, max_inputs is not UNSET, f"the batched route {rule!r}")
        levels = EndpointPriority.checked(priority, priority_header, f"the batched route {rule!r}")
        given = (("timeout_header", timeout_header), ("envoy_timeout", envoy_timeout))
        deadline = {key: value for key, value in given if value is not UNSET}
        EndpointDeadline.checked(
            deadline.get("timeout_header"), deadline.get("envoy_timeout", False), f"the batched route {rule!r}"
        )
        if model is None:
            raise TypeError(
                f"the batched route {rule!r} needs a model: a batch function, a ManagedModel subclass, or the "
                "endpoint of another batched route whose model it serves"
            )
        if isinstance(model, str):
            check_sharing(rule, endpoint, overrides, init_args, init_kwargs)
        check_batch_function(model, f"the batched route {rule!r}")
        decorators = self.decorators if decorators is None else checked(decorators, f"the batched route {rule!r}")
        for name, hook in (("parse", parse), ("respond", respond)):
            if hook is not None and not callable(hook):
                raise TypeError(f"{name} of the batched route {rule!r} must be callable, got {hook!r}")
        if endpoint is None:
            endpoint = getattr(model, "__name__", None)
            if not endpoint:
                raise TypeError(f"give the batched route {rule!r} an endpoint name")
        methods = [method.upper() for method in ([methods] if isinstance(methods, str) else methods)]
        route = BatchedRoute(
            self,
            rule,
            endpoint,
            model,
            blueprint,
            field,
            parse,
            respond,
            init_args,
            dict(init_kwargs or {}),
            overrides,
            methods,
            max_body_bytes,
            many,
            max_inputs,
            levels,
            decorators,
            deadline,
        )
        with self._lock:
            apps = [app for app in (ref() for ref in self._apps) if app is not None]
        # Check the route against every app first: a refused route leaves no trace.
        handles = [(app, route.handle(state_of(app).settings, state_of(app).handles)) for app in apps]
        if blueprint is not None:
            blueprint.add_url_rule(rule, endpoint, route.view, methods=methods)
        with self._lock:
            self._routes.append(route)
        for app, handle in handles:
            self._attach(app, state_of(app), route, handle)
        return route

    def _attach(self, app: Flask, state: AppState, route: BatchedRoute, handle: Optional[LazyStreamer] = None) -> None:
        state.handles[route] = handle or route.handle(state.settings, state.handles)
        if route.blueprint is None:
            app.add_url_rule(route.rule, route.endpoint, route.view, methods=route.methods)

    # -- streamers ---------------------------------------------------------------

    def routes(self, app: Optional[Flask] = None) -> List[BatchedRoute]:
        """The batched routes served by ``app`` (default: the current app),
        blueprints' included once the blueprint is registered."""
        app = app or current_app._get_current_object()  # type: ignore[attr-defined]
        views = set(map(id, app.view_functions.values()))
        return [route for route in state_of(app).handles if id(route.view) in views]

    def get_streamer(self, endpoint: str, app: Optional[Flask] = None) -> BaseStreamer:
        """The streamer behind the batched route ``endpoint`` (started if it
        is not yet), to call ``predict``/``submit`` from a view of your own."""
        app = app or current_app._get_current_object()  # type: ignore[attr-defined]
        state = state_of(app)
        for route in state.handles:
            if route.name == endpoint or route.endpoint == endpoint:
                return state.handles[route].get()
        names = ", ".join(route.name for route in state.handles) or "none"
        raise KeyError(f"no batched route {endpoint!r} in this app (batched routes: {names})")

    def start(self, app: Optional[Flask] = None, wait: bool = True, timeout: float = 120.0) -> None:
        """Start every batched route's streamer in this process now rather
        than on its first request; with ``wait``, until the models this
        process runs are loaded (for up to ``timeout`` seconds; Redis workers
        run elsewhere, and are not waited for). Call it after forking, as
        gunicorn's ``post_worker_init`` hook does (see
        :func:`start_streamers`), never before."""
        app = app or current_app._get_current_object()  # type: ignore[attr-defined]
        state = state_of(app)
        start_all([state.handles[route] for route in self.routes(app)], wait, timeout)

    def close(self, app: Optional[Flask] = None, timeout: float = 10.0) -> None:
        """Finish the calls in hand and stop every streamer of ``app`` that
        this process started (their workers too). A later request starts
        them again."""
        app = app or current_app._get_current_object()  # type: ignore[attr-defined]
        for handle in state_of(app).handles.values():
            handle.close(timeout)

    # -- requests ----------------------------------------------------------------

    def drain(self, app: Optional[Flask] = None, timeout: float = 10.0) -> None:
        """Shut this process's side down gracefully: from now on new calls to
        a batched route get 503 with ``Retry-After`` (and readiness answers
        503), while calls in hand finish for up to ``timeout`` seconds; then
        every streamer stops. For a server's shutdown hook (see the README)."""
        app = app or current_app._get_current_object()  # type: ignore[attr-defined]
        state_of(app).draining = True
        self.close(app, timeout)

    def serve_request(self, route: BatchedRoute) -> Any:
        """The answer to the current request to ``route``, one of this
        extension's batched routes: what the route's view returns (see
        :func:`flask_streamer.serving.serve`)."""
        return serve(route)


def start_streamers(app: Flask, wait: bool = True, timeout: float = 120.0) -> None:
    """Load the models of ``app``'s batched routes in this process now, not
    on their first request: a server's worker calls it as it boots, e.g. in
    gunicorn's ``post_worker_init`` hook::

        def post_worker_init(worker):
            from flask_streamer import start_streamers
            start_streamers(worker.wsgi)

    See :meth:`FlaskStreamer.start`."""
    state_of(app).extension.start(app, wait, timeout)


def json_error(exc: BaseException, name: str = "") -> Any:
    """The JSON error response for ``exc`` in a view of your own, as a
    batched route answers it (status by
    :func:`streamer_core.web.http.status_for`, ``Retry-After`` with a 503,
    a 500 logged with its traceback); ``name`` names the view in the log.
    Catch what a call to :meth:`FlaskStreamer.get_streamer`'s streamer, or
    :func:`request_item`, raises::

        try:
            output = streamer.get_streamer("stream").predict([request_item("s")])[0]
        except Exception as exc:
            return json_error(exc, "my_view")"""
    app = current_app._get_current_object()  # type: ignore[attr-defined]
    return state_of(app).cycle.error(name or request.path, exc)
