"""A batched view's options, as every form of it takes them: the function
form (:func:`~django_streamer.views.batched_view`), the class forms
(:class:`~django_streamer.views.BatchedView`, its async form) and the DRF
one (:class:`~django_streamer.rest.BatchedAPIView`).

:class:`BatchedOptions` holds the class forms' options and their checks as
a view is made; the functions check the options of any form as it is
declared, and read what a request says under them: its level, its deadline,
its span's name. One place, so that every form takes an option alike.
"""

from __future__ import annotations

import functools
import logging
from typing import Any, Callable, ClassVar, Dict, Iterable, Optional, Sequence, Tuple, cast

from django.conf import settings
from django.http import HttpRequest

from streamer_core.web.body import check_many
from streamer_core.web.cycle import Deadline, Traced
from streamer_core.web.deadline import EndpointDeadline, environ_headers
from streamer_core.web.priority import EndpointPriority

from . import conf
from .registry import get_spec

__all__ = [
    "PROJECTS",
    "BatchedOptions",
    "check_options",
    "check_view_many",
    "check_deadline",
    "level_of",
    "deadline_of",
    "traced",
    "mark",
    "debug",
    "logger",
]

logger = logging.getLogger("django_streamer")

#: A view's deadline option not given: the project's (``STREAMER["TIMEOUT_HEADER"]``, ``["ENVOY_TIMEOUT"]``).
PROJECTS: Any = type("ProjectsSetting", (), {"__repr__": lambda self: "PROJECTS"})()


class BatchedOptions:
    """The options of a class-based batched view, set on a subclass or
    given to ``as_view``; :meth:`checked_options` checks them as the view
    is made, so that a wrong one fails at import, not at a request."""

    #: The key of ``STREAMER["MODELS"]`` this view serves.
    model: Optional[str] = None
    #: The JSON key or form field holding the input; None: the whole body.
    field: Optional[str] = None
    #: Whether a request carries a list of inputs, each run on its own and answered in order.
    many: bool = False
    #: The most inputs of a request, with ``many``; None: ``STREAMER["MAX_INPUTS"]``.
    max_inputs: Optional[int] = None
    #: The level of the view's requests; None: the model's ``DEFAULT_PRIORITY``.
    priority: Optional[int] = None
    #: ``True`` (``X-Priority``) or a header's name: a request may choose its level by it.
    priority_header: Any = False
    #: The header a client says its remaining wait in (seconds); default: the project's; None: none.
    timeout_header: Any = PROJECTS
    #: Whether Envoy's ``x-envoy-expected-rq-timeout-ms`` is read too; default: the project's.
    envoy_timeout: Any = PROJECTS

    #: How the view is named in a message about its priority options.
    _noun: ClassVar[str] = "the batched view of"

    @classmethod
    def checked_options(cls, initkwargs: Dict[str, Any]) -> Tuple[str, EndpointPriority]:
        """The model and levels of the view ``as_view(**initkwargs)`` makes,
        its options checked (``TypeError`` or ``ValueError`` naming the
        wrong one)."""
        model = initkwargs.get("model", cls.model)
        check_options(model, None, ("POST",))
        check_view_many(model, initkwargs.get("many", cls.many), initkwargs.get("max_inputs", cls.max_inputs))
        priority = EndpointPriority.checked(
            initkwargs.get("priority", cls.priority),
            initkwargs.get("priority_header", cls.priority_header),
            f"{cls._noun} {model!r}",
        )
        check_deadline(
            model,
            initkwargs.get("timeout_header", cls.timeout_header),
            initkwargs.get("envoy_timeout", cls.envoy_timeout),
        )
        return cast(str, model), priority  # check_options refused any other

    def _most(self) -> Optional[int]:
        """The most inputs of a request to this view; ``None`` without ``many``."""
        return (self.max_inputs or conf.max_inputs()) if self.many else None

    def _priority(self) -> EndpointPriority:
        return EndpointPriority.checked(self.priority, self.priority_header, f"{self._noun} {self.model!r}")


def check_options(model: Any, respond: Optional[Callable[..., Any]], methods: Iterable[str]) -> Sequence[str]:
    """Check a view's model and ``respond`` hook; return its methods, upper-cased."""
    if not isinstance(model, str) or not model:
        raise TypeError(f"name the model of a batched view as in STREAMER['MODELS'], e.g. 'embed'; got {model!r}")
    if respond is not None and not callable(respond):
        raise TypeError(
            f"respond of the batched view of {model!r} must be callable (output -> response), got {respond!r}"
        )
    allowed = [methods.upper()] if isinstance(methods, str) else [method.upper() for method in methods]
    if not allowed:
        raise TypeError(f"the batched view of {model!r} needs at least one HTTP method, e.g. methods=['POST']")
    return allowed


def check_view_many(model: Any, many: Any, max_inputs: Any) -> None:
    """Check a view's ``many`` and ``max_inputs`` (None: the project's)."""
    check_many(many, max_inputs, max_inputs is not None, f"the batched view of {model!r}")


def check_deadline(model: Any, timeout_header: Any, envoy_timeout: Any) -> None:
    """Check a view's own deadline options as it is declared."""
    header = None if timeout_header is PROJECTS else timeout_header
    EndpointDeadline.checked(
        header, False if envoy_timeout is PROJECTS else envoy_timeout, f"the batched view of {model!r}"
    )


def level_of(request: HttpRequest, model: str, priority: EndpointPriority) -> Optional[Callable[[], Optional[int]]]:
    """How the cycle learns the level of ``request`` to a view of ``model``
    with ``priority``; ``None`` where the view says nothing of levels."""
    if not priority.given:
        return None
    header = priority.header
    return lambda: priority.level(request.headers.get(header) if header else None, get_spec(model).config)


@functools.lru_cache(maxsize=64)
def _endpoint_deadline(header: Any, envoy: bool, model: str) -> EndpointDeadline:
    return EndpointDeadline.checked(header, envoy, f"the batched view of {model!r}")


def deadline_of(request: HttpRequest, model: str, timeout_header: Any, envoy_timeout: Any) -> Optional[Deadline]:
    """How the cycle learns the timeout of ``request``'s call from its
    deadline headers (:mod:`streamer_core.web.deadline`), by the view's own
    options or the project's; ``None`` where no header is read."""
    header = conf.timeout_header() if timeout_header is PROJECTS else timeout_header
    envoy = conf.envoy_timeout() if envoy_timeout is PROJECTS else envoy_timeout
    deadline = _endpoint_deadline(header, envoy, model)
    if not deadline.reads:
        return None
    return lambda level: deadline.timeout(environ_headers(request.META), get_spec(model).config, level)


def traced(request: HttpRequest, model: str) -> Optional[Traced]:
    """The request's method and route, for its span, when its model traces
    (``TRACING``); else ``None``. An unknown model or bad settings is not
    traced: the cycle answers that, as it always has."""
    try:
        if not get_spec(model).config.tracing:
            return None
    except Exception:
        return None
    match = request.resolver_match
    route = f"/{match.route}" if match is not None and match.route else request.path
    return request.method or "POST", route


def mark(view: Any, model: Any, priority: EndpointPriority) -> None:
    """What the system checks read of a batched view (E010, E011)."""
    view.streamer_model = model
    view.streamer_priority = priority


def debug() -> bool:
    """Whether the project runs under ``DEBUG`` (a 500 then says its traceback)."""
    return bool(settings.DEBUG)
