"""One batched route of a :class:`~flask_streamer.FlaskStreamer`: its URL
rule, its model (or the batched route whose model it serves), its options
and hooks, and how its model spec follows from an app's settings."""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Mapping, Optional, Protocol, Sequence

from flask import Blueprint, Request

from streamer_core.errors import ConfigurationError
from streamer_core.web.priority import EndpointPriority
from streamer_core.web.spec import LazyStreamer, ModelSpec

from .decorators import ViewDecorator, apply
from .settings import setting_name

__all__ = ["BatchedRoute", "ParseHook", "RespondHook", "UNSET", "check_sharing"]

#: A route keyword not given: the app's setting holds.
UNSET: Any = object()

ParseHook = Callable[[Request], Any]
RespondHook = Callable[[Any], Any]


class Serving(Protocol):
    """What serves a route's requests: its :class:`~flask_streamer.FlaskStreamer`."""

    def serve_request(self, route: BatchedRoute) -> Any: ...


class BatchedRoute:
    """One batched endpoint: its URL rule, model, options and hooks. Made by
    :meth:`FlaskStreamer.batched_route` and :meth:`FlaskStreamer.add_batched_route`."""

    def __init__(
        self,
        extension: Serving,
        rule: str,
        endpoint: str,
        model: Any,
        blueprint: Optional[Blueprint],
        field: Optional[str],
        parse: Optional[ParseHook],
        respond: Optional[RespondHook],
        init_args: Sequence[Any],
        init_kwargs: Dict[str, Any],
        overrides: Dict[str, Any],
        methods: List[str],
        max_body_bytes: Any = UNSET,
        many: bool = False,
        max_inputs: Any = UNSET,
        priority: EndpointPriority = EndpointPriority(None, None),  # noqa: B008  (an immutable tuple)
        decorators: Sequence[ViewDecorator] = (),
        deadline_options: Optional[Dict[str, Any]] = None,
    ) -> None:
        self.extension = extension
        self.rule = rule
        self.methods = methods
        self.endpoint = endpoint
        self.model = model
        self.blueprint = blueprint
        self.field = field
        self.parse = parse
        self.respond = respond
        self.init_args = tuple(init_args)
        self.init_kwargs = dict(init_kwargs)
        self.overrides = overrides
        #: The route's own limit on a body's bytes; unset: the app's.
        self.max_body_bytes = max_body_bytes
        #: Whether a request carries a list of inputs, and the route's own most of them (unset: the app's).
        self.many = many
        self.max_inputs = max_inputs
        #: The level of the route's requests, and the header it lets them choose one by.
        self.priority = priority
        #: The route's own ``timeout_header`` and ``envoy_timeout``, where given (else the app's).
        self.deadline_options = dict(deadline_options or {})
        #: The view decorators, applied as Flask's ``View.decorators`` (the first innermost).
        self.decorators = tuple(decorators)
        #: What the app calls for a request: the route's view, its decorators applied.
        self.view = self._make_view()

    @property
    def name(self) -> str:
        """The endpoint as the app knows it (``blueprint.endpoint`` in a blueprint)."""
        return f"{self.blueprint.name}.{self.endpoint}" if self.blueprint is not None else self.endpoint

    @property
    def serves(self) -> Optional[str]:
        """The batched route whose model this one serves (``model="embed"``:
        its endpoint), sharing its queue and settings; ``None``: its own model."""
        return self.model if isinstance(self.model, str) else None

    def written_as(self, field: str) -> str:
        """How an option of this route's model was given: the route's keyword, or the app's setting."""
        if field in self.overrides or field in ("model", "init_args", "init_kwargs"):
            return f"{field} of the batched route {self.rule!r}"
        return setting_name(field)

    def spec(self, settings: Dict[str, Any]) -> ModelSpec:
        """This route's model spec under an app's settings, checked (a route
        of its own model only)."""
        values = dict(settings, **self.overrides, init_args=self.init_args, init_kwargs=self.init_kwargs)
        if "prefix" not in self.overrides:
            values["prefix"] = f"{settings['prefix']}:{self.name}" if settings["prefix"] else self.name
        spec = ModelSpec.checked(self.name, self.model, values, self.written_as)
        self._check_priority(spec, self.written_as("priority_levels"))
        return spec

    def handle(self, settings: Dict[str, Any], handles: Mapping[BatchedRoute, LazyStreamer]) -> LazyStreamer:
        """This route's streamer in an app of ``settings`` whose batched
        routes so far have ``handles``: its own, or, for a route serving
        another's model, that route's. Raises :class:`ConfigurationError`
        for wrong settings, or a route to share that the app lacks."""
        serves = self.serves
        if serves is None:
            return LazyStreamer(self.spec(settings))
        for route, handle in handles.items():
            if serves in (route.name, route.endpoint) and route.serves is None:
                self._check_priority(handle.spec, route.written_as("priority_levels"))
                return handle
        problem = (
            f"the batched route {self.rule!r} serves the model of the batched route {serves!r}, which this app does "
            f"not have (it has {', '.join(route.name for route in handles if route.serves is None) or 'none'}): "
            "declare that route first, or name one it has"
        )
        raise ConfigurationError(f"bad streamer settings (for {self.name}):\n  {problem}", [problem])

    def _check_priority(self, spec: ModelSpec, levels_name: str) -> None:
        problem = self.priority.problem(spec.config.priority_levels, f"the batched route {self.rule!r}", levels_name)
        if problem is not None:
            raise ConfigurationError(f"bad streamer settings (for {self.name}):\n  {problem}", [problem])

    def _make_view(self) -> Callable[..., Any]:
        route = self

        def view(**_url_values: Any) -> Any:
            return route.extension.serve_request(route)

        # Named as the route (its blueprint's too), not as this closure: flask-limiter,
        # say, keys a limit by the name of the view it decorates, one per route.
        view.__name__ = self.endpoint
        view.__qualname__ = self.name
        if self.serves is None:
            view.__module__ = getattr(self.model, "__module__", None) or view.__module__
            view.__doc__ = getattr(self.model, "__doc__", None)
        else:
            view.__doc__ = None
        return apply(view, self.decorators, f"the batched route {self.rule!r}")

    def __repr__(self) -> str:
        return f"<BatchedRoute {self.name} {self.rule!r}>"


def check_sharing(
    rule: str, endpoint: Optional[str], overrides: Dict[str, Any], init_args: Sequence[Any], init_kwargs: Any
) -> None:
    """A route serving another batched route's model (``model="embed"``)
    takes that route's settings: it has its own endpoint, and none of them."""
    if endpoint is None:
        raise TypeError(f"give the batched route {rule!r} an endpoint name of its own (endpoint='...')")
    given = sorted(overrides) + (["init_args"] if init_args else []) + (["init_kwargs"] if init_kwargs else [])
    if given:
        raise TypeError(
            f"the batched route {rule!r} serves another route's model, whose settings it shares: set "
            f"{', '.join(given)} on that route instead"
        )
