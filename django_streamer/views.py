"""Batched views: parse the request into one model input, run it through the
model's streamer with other requests' inputs, answer the output as JSON.

The function form, a decorator on the parse step::

    @batched_view("embed")
    def stream(request):                  # -> the model input; raise InvalidInput for a 400
        return request_item(request, "s")

    @batched_view("embed")
    async def astream(request):           # an async view (ASGI): awaits its result
        return request_item(request, "s")

The class form, for when the default parsing does::

    path("stream", BatchedView.as_view(model="embed", field="s"))
    path("astream", AsyncBatchedView.as_view(model="embed", field="s"))

Errors are answered as the Flask extension answers them
(:mod:`streamer_core.web.http`): 400 for input that cannot be parsed, 500 when
the model raised for this input, 504 on timeout, 503 with ``Retry-After``
when the queue is full, no worker can start or Redis does not answer; every
body is JSON, with the traceback only under ``DEBUG``.

The views are exempt from CSRF checks by default (``csrf_exempt=False`` to
keep them): they are JSON APIs called by programs, as the Flask extension's
routes are. A request whose user Django's session logged in is checked all
the same, since a browser sends the session's cookie on a cross-site
request too (:mod:`django_streamer.csrf`). Django's view decorators work on
every form (``login_required``, ``cache_control``; ``method_decorator`` on
a class's ``dispatch``). Sync views block their thread while they wait;
under an ASGI server use the async forms, which await without blocking the
event loop (Django runs every sync view of an ASGI server on one thread, so
sync views there are served one at a time and never batched together).
"""

from __future__ import annotations

import functools
import inspect
from typing import Any, Awaitable, Callable, Dict, Iterable, Optional, Sequence, Union, cast

from django.http import HttpRequest, HttpResponse, JsonResponse
from django.utils.decorators import classonlymethod
from django.views import View

from streamer_core.errors import MethodNotAllowed
from streamer_core.web.cycle import Cycle
from streamer_core.web.http import (
    dumps_json,
    error_body,
    json_answer,
)
from streamer_core.web.peer import client_socket
from streamer_core.web.priority import EndpointPriority

from . import conf, csrf
from .reading import json_body, read_error, request_inputs, request_item, request_upload
from .registry import aget_streamer, draining, get_streamer
from .view_options import (
    PROJECTS,
    BatchedOptions,
    check_deadline,
    check_options,
    check_view_many,
    deadline_of,
    debug,
    level_of,
    logger,
    mark,
    traced,
)

__all__ = [
    "batched_view",
    "BatchedView",
    "AsyncBatchedView",
    "request_item",
    "request_inputs",
    "request_upload",
    "json_body",
    "json_error",
    "page_not_found",
    "server_error",
]

ParseFunction = Callable[..., Any]
Respond = Callable[[Any], Union[HttpResponse, Awaitable[HttpResponse]]]


def json_error(exc: BaseException, model: Optional[str] = None) -> JsonResponse:
    """The JSON error response for ``exc`` (status by
    :func:`streamer_core.web.http.status_for`, ``Retry-After`` with a 503),
    logged when it is the server's fault. What Django raised reading a body
    is answered as the batched views answer it (a body too large: 413)."""
    return cast(JsonResponse, _CYCLE.error(model or "?", read_error(exc) or exc))


def json_reply(status: int, body: Dict[str, Any], headers: Dict[str, str]) -> JsonResponse:
    """A JSON answer with its headers, as the request cycle and the probes give it."""
    response = JsonResponse(body, status=status)
    for name, value in headers.items():
        response[name] = value
    return response


def page_not_found(request: HttpRequest, exception: Optional[Exception] = None) -> JsonResponse:
    """A JSON 404, for a project whose every answer is JSON: in the root
    URLconf, ``handler404 = "django_streamer.views.page_not_found"``."""
    return JsonResponse(error_body(404, "NotFound", f"nothing is served at {request.path}"), status=404)


def bad_request(request: HttpRequest, exception: Optional[Exception] = None) -> JsonResponse:
    """A JSON 400 for what Django refuses before any view runs (a ``Host``
    header not in ``ALLOWED_HOSTS``, another suspicious request):
    ``handler400 = "django_streamer.views.bad_request"``. The reason stays in
    Django's log (``django.security``), not in the answer, as Django's own
    page keeps it."""
    return JsonResponse(error_body(400, "BadRequest", "the request was refused as malformed or unsafe"), status=400)


def permission_denied(request: HttpRequest, exception: Optional[Exception] = None) -> JsonResponse:
    """A JSON 403 (``PermissionDenied`` raised in a view or middleware):
    ``handler403 = "django_streamer.views.permission_denied"``."""
    return JsonResponse(error_body(403, "Forbidden", "this request is not allowed"), status=403)


def server_error(request: HttpRequest) -> JsonResponse:
    """A JSON 500 (Django has logged the error): ``handler500 =
    "django_streamer.views.server_error"`` in the root URLconf."""
    body = error_body(500, "InternalServerError", "the server failed to answer this request")
    return JsonResponse(body, status=500)


_CYCLE: Cycle[HttpResponse] = Cycle(json_reply, logger, "the batched view of", debug, read_error, conf.error_details)


def default_respond(output: Any) -> HttpResponse:
    """The output as JSON: NumPy arrays and tensors as they are, by orjson
    where it is installed (see :func:`streamer_core.web.http.dumps_json`)."""
    return HttpResponse(json_answer(output, dumps_json), content_type="application/json")


def _refusal(request: HttpRequest, allowed: Sequence[str], model: str, exempt: bool) -> Optional[HttpResponse]:
    """The answer to a request the view does not serve (a method it does not
    take: 405; a failed CSRF check it needs: 403), or ``None``. ``exempt``:
    the view's own option, which Django's CSRF decorators on it override."""
    if request.method not in allowed:
        return json_error(MethodNotAllowed(str(request.method), allowed), model)
    return csrf.refusal(request, csrf.exempt_for(request, exempt))


async def _arefusal(request: HttpRequest, allowed: Sequence[str], model: str, exempt: bool) -> Optional[HttpResponse]:
    """:func:`_refusal` for an async view."""
    if request.method not in allowed:
        return json_error(MethodNotAllowed(str(request.method), allowed), model)
    return await csrf.arefusal(request, csrf.exempt_for(request, exempt))


def batched_view(
    model: str,
    *,
    respond: Optional[Respond] = None,
    methods: Iterable[str] = ("POST",),
    csrf_exempt: bool = True,
    many: bool = False,
    max_inputs: Optional[int] = None,
    priority: Optional[int] = None,
    priority_header: Any = False,
    timeout_header: Any = PROJECTS,
    envoy_timeout: Any = PROJECTS,
) -> Callable[[ParseFunction], Callable[..., Any]]:
    """Make a view of a parse function ``parse(request, *url_args, **url_kwargs)
    -> model input`` serving the model ``model`` (a key of
    ``STREAMER["MODELS"]``). An ``async def`` parse function makes an async
    view. ``respond(output) -> HttpResponse`` replaces the default JSON
    answer. Other methods than ``methods`` are answered 405.

    ``many=True``: the parse function returns a list of inputs
    (:func:`request_inputs` reads them by the default rule), at most
    ``max_inputs`` (default ``STREAMER["MAX_INPUTS"]``, 2048; more is a 413
    before anything is queued). Each input runs as one of the model's,
    batched with others', and ``respond`` gets the outputs in order (by
    default a JSON array); an input that fails fails the request with its
    index in the message.

    ``priority``: the level of the view's requests (the model's
    ``DEFAULT_PRIORITY`` otherwise); ``priority_header`` (``True`` for
    ``X-Priority``, or a header's name): let a request choose its own level
    by it, a 400 for a value that is not a level
    (:mod:`streamer_core.web.priority`; check ``django_streamer.E011``).

    ``timeout_header`` (default ``STREAMER["TIMEOUT_HEADER"]``,
    ``X-Request-Timeout``; ``None``: none) and ``envoy_timeout``: the
    request headers a client says how long it will wait in; its call's
    timeout is that, never more than the model's
    (:mod:`streamer_core.web.deadline`).

    The parse function raises :class:`InvalidInput` for a 400 with its
    message; ``ValueError``, ``TypeError`` and ``KeyError`` are 400s too."""
    allowed = check_options(model, respond, methods)
    check_view_many(model, many, max_inputs)
    levels = EndpointPriority.checked(priority, priority_header, f"the batched view of {model!r}")
    check_deadline(model, timeout_header, envoy_timeout)
    answer = respond or default_respond

    def most() -> Optional[int]:
        return (max_inputs or conf.max_inputs()) if many else None

    def decorator(parse: ParseFunction) -> Callable[..., Any]:
        if not callable(parse):
            raise TypeError(f"@batched_view({model!r}) decorates a function taking the request, got {parse!r}")
        view: Callable[..., Any]
        if inspect.iscoroutinefunction(parse):

            @functools.wraps(parse)
            async def async_view(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
                refusal = await _arefusal(request, allowed, model, csrf_exempt)
                if refusal is not None:
                    return refusal
                return await _CYCLE.aserve(
                    model,
                    lambda: aget_streamer(model),
                    lambda: parse(request, *args, **kwargs),
                    answer,
                    draining(),
                    most(),
                    traced(request, model),
                    level_of(request, model, levels),
                    deadline_of(request, model, timeout_header, envoy_timeout),
                )

            view = async_view
        else:

            @functools.wraps(parse)
            def sync_view(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
                refusal = _refusal(request, allowed, model, csrf_exempt)
                if refusal is not None:
                    return refusal
                return _CYCLE.serve(
                    model,
                    lambda: get_streamer(model),
                    lambda: parse(request, *args, **kwargs),
                    answer,
                    draining(),
                    most(),
                    traced(request, model),
                    client_socket(request.META),
                    level_of(request, model, levels),
                    deadline_of(request, model, timeout_header, envoy_timeout),
                )

            view = sync_view
        marked: Any = view  # a function: these attributes are its own
        mark(marked, model, levels)
        # Django's middleware skips the view; it checks CSRF itself unless exempt,
        # so that a failure is answered as JSON.
        marked.csrf_exempt = True
        return view

    return decorator


class BatchedView(BatchedOptions, View):
    """A class-based batched view: ``POST`` parses the request with
    :meth:`parse`, runs the input through the model ``model`` and answers
    :meth:`respond`'s response. Configure it in ``as_view(model="embed",
    field="s")`` or in a subclass, overriding :meth:`parse` and
    :meth:`respond` as needed. Its options (``model``, ``field``, ``many``,
    ...) are :class:`~django_streamer.view_options.BatchedOptions`'s."""

    #: Whether the view skips Django's CSRF check (it is an API for programs).
    csrf_exempt: bool = True

    def parse(self, request: HttpRequest, *args: Any, **kwargs: Any) -> Any:
        """The model input of ``request`` (with ``many``, the list of its
        inputs); raise :class:`InvalidInput` for a 400."""
        return request_inputs(request, self.field) if self.many else request_item(request, self.field)

    def respond(self, output: Any) -> HttpResponse:
        """The response for the model's ``output`` (default: it as JSON)."""
        return default_respond(output)

    def dispatch(self, request: HttpRequest, *args: Any, **kwargs: Any) -> Any:
        assert self.model is not None  # as_view checked it
        if self.view_is_async:  # an async post of a subclass's: Django awaits what dispatch returns
            return self._adispatch(request, *args, **kwargs)
        refusal = _refusal(request, ["POST"], self.model, self._exempt())
        return refusal if refusal is not None else super().dispatch(request, *args, **kwargs)

    async def _adispatch(self, request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        assert self.model is not None  # as_view checked it
        refusal = await _arefusal(request, ["POST"], self.model, self._exempt())
        if refusal is not None:
            return refusal
        return await cast(Awaitable[HttpResponse], super().dispatch(request, *args, **kwargs))

    def _exempt(self) -> bool:
        """The view's own CSRF option: ``csrf_exempt``, or Django's
        ``csrf_exempt`` on ``dispatch`` (by ``method_decorator``)."""
        return self.csrf_exempt or bool(getattr(type(self).dispatch, "csrf_exempt", False))

    def post(self, request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        model = self.model
        assert model is not None  # as_view checked it
        return _CYCLE.serve(
            model,
            lambda: get_streamer(model),
            lambda: self.parse(request, *args, **kwargs),
            self.respond,
            draining(),
            self._most(),
            traced(request, model),
            client_socket(request.META),
            level_of(request, model, self._priority()),
            deadline_of(request, model, self.timeout_header, self.envoy_timeout),
        )

    @classonlymethod
    def as_view(cls, **initkwargs: Any) -> Callable[..., Any]:
        model, priority = cls.checked_options(initkwargs)
        view = super().as_view(**initkwargs)
        marked: Any = view
        mark(marked, model, priority)
        marked.csrf_exempt = True  # dispatch() checks CSRF itself unless exempt, answering JSON
        return view


class AsyncBatchedView(BatchedView):
    """:class:`BatchedView` as an async view, for ASGI servers: it awaits the
    result without blocking the event loop. :meth:`parse` and :meth:`respond`
    may be plain or ``async`` methods."""

    async def dispatch(self, request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:  # type: ignore[override]
        """Async, so that Django's decorators on it (``method_decorator(login_required,
        name="dispatch")``) take their async form, which awaits the view."""
        return await self._adispatch(request, *args, **kwargs)

    async def post(self, request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:  # type: ignore[override]
        model = self.model
        assert model is not None  # as_view checked it
        return await _CYCLE.aserve(
            model,
            lambda: aget_streamer(model),
            lambda: self.parse(request, *args, **kwargs),
            self.respond,
            draining(),
            self._most(),
            traced(request, model),
            level_of(request, model, self._priority()),
            deadline_of(request, model, self.timeout_header, self.envoy_timeout),
        )
