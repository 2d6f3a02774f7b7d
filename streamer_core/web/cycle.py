"""The request cycle of a batched endpoint, whatever the web framework.

::

    request --> draining? ------------------------------------> 503 Retry-After
            --> parse (the route's hook, or the default rule) -> 400 / 405 / 413 / 415
            --> the model's streamer: predict([input])  -------> 500 / 503 / 504
                (sync: blocks this thread; async: awaits)
            --> respond (the route's hook, or JSON) ----------> 500
            --> the response

The Flask extension and the Django app are thin adapters around
:class:`Cycle`: each gives it a way to answer an error in its framework
(``reply``), its logger, its debug flag, and the exceptions its own body
parsing raises (``read_error``); they keep only what is theirs (routing, the
request object, CSRF). So one model behaves alike behind either, in every
failure: the statuses are :mod:`streamer_core.web.http`'s, every call is
counted once in :mod:`streamer_core.telemetry.stats`, and a 5xx is logged as
:func:`~streamer_core.web.http.log_unavailable` says.
"""

from __future__ import annotations

import inspect
import logging
from typing import TYPE_CHECKING, Any, Awaitable, Callable, Dict, Generic, List, Optional, Tuple, TypeVar

from ..errors import ClientDisconnected, InvalidInput, StreamerClosedError
from ..future import BatchFuture
from ..streamer import BaseStreamer
from ..telemetry import tracing  # OpenTelemetry itself is imported only when a span is made
from ..telemetry.stats import stats_for
from .body import inputs_of
from .http import error_id, error_response, log_unavailable, status_for
from .peer import await_call, peer_closed, wait_call

if TYPE_CHECKING:
    from opentelemetry.trace import Span

__all__ = ["Cycle", "Deadline", "Reply", "Traced"]

R = TypeVar("R")

#: ``reply(status, json_body, headers)``: the framework's response.
Reply = Callable[[int, Dict[str, Any], Dict[str, str]], R]
#: A request to trace, as its span names it: its method and route (``("POST", "/embed")``).
Traced = Tuple[str, str]
#: ``deadline(level)``: a request's call timeout from its deadline header (``None``: the model's).
Deadline = Callable[[Optional[int]], Optional[float]]


class Cycle(Generic[R]):
    """The request cycle of the batched endpoints of one app.

    ``reply`` makes the framework's response of an error; ``log`` is where a
    500 and a run of 503s are logged, under ``noun`` and the endpoint's name
    (``"the batched route"``); ``debug()`` says whether an error's body
    carries its traceback; ``read_error(exc)`` turns what the framework
    raised while reading a body (a malformed form, a body over its limit)
    into an :class:`InvalidInput` of the right status, or ``None`` when it
    is not such an error; ``details()``: whether a 500 says its exception's
    type and message (``None``: as ``debug()`` says)."""

    def __init__(
        self,
        reply: Reply[R],
        log: logging.Logger,
        noun: str,
        debug: Callable[[], bool],
        read_error: Callable[[BaseException], Optional[InvalidInput]],
        details: Optional[Callable[[], Optional[bool]]] = None,
    ) -> None:
        self.reply = reply
        self.log = log
        self.noun = noun
        self.debug = debug
        self.read_error = read_error
        self.details = details

    # -- the cycle ---------------------------------------------------------------

    def serve(
        self,
        name: str,
        streamer: Callable[[], BaseStreamer],
        parse: Callable[[], Any],
        respond: Callable[[Any], Any],
        draining: bool = False,
        many: Optional[int] = None,
        traced: Optional[Traced] = None,
        client: Optional[Any] = None,
        priority: Optional[Callable[[], Optional[int]]] = None,
        deadline: Optional[Deadline] = None,
    ) -> R:
        """Serve one request to the endpoint ``name``: refuse it while
        ``draining``, ``parse()`` it into the model's input, run that through
        ``streamer()`` with other requests' inputs, and ``respond(output)``;
        every failure on the way is the error response for it. ``many``: the
        endpoint takes many inputs in a request, at most that many: ``parse()``
        gives their list, each runs as an input of its own (batched with
        others', spread over batches and workers), and ``respond`` gets
        their outputs, in order; an input that fails is named in the error.
        ``traced``: the request's method and route when its model traces:
        it is served inside a span of its own (:mod:`streamer_core.telemetry.tracing`),
        with one for each of parsing and responding. ``client``: the
        client's socket where the server gives it
        (:func:`~streamer_core.web.peer.client_socket`): a client that
        closes it while the request waits gives the call up
        (:mod:`streamer_core.web.peer`). ``priority``: where the endpoint
        says the level of its requests, ``priority()`` gives it (``None``:
        the model's default), or raises :class:`InvalidInput` for a 400
        before anything is read or queued (:mod:`streamer_core.web.priority`).
        ``deadline``: where the endpoint reads the client's deadline,
        ``deadline(level)`` gives the call's timeout (``None``: the
        model's), or raises :class:`InvalidInput` for a 400, before anything
        is read or queued (:mod:`streamer_core.web.deadline`)."""
        if traced is None or tracing.silent():  # silent: no SDK set up, no span would record
            return self._serve(name, streamer, parse, respond, draining, many, None, client, priority, deadline)
        request = tracing.request_span(traced[0], traced[1], name)
        with request as span:
            if not span.is_recording():  # not sampled (or a provider's span that records nothing): no steps either
                return self._serve(name, streamer, parse, respond, draining, many, None, client, priority, deadline)
            return self._serve(
                name,
                streamer,
                _in_span("parse", parse, request),
                _in_span("respond", respond, request),
                draining,
                many,
                span,
                client,
                priority,
                deadline,
            )

    def _serve(
        self,
        name: str,
        streamer: Callable[[], BaseStreamer],
        parse: Callable[[], Any],
        respond: Callable[[Any], Any],
        draining: bool,
        many: Optional[int],
        span: Optional[Span],
        client: Optional[Any],
        priority: Optional[Callable[[], Optional[int]]] = None,
        deadline: Optional[Deadline] = None,
    ) -> R:
        if draining:
            return self.refuse_while_draining(name, span)
        try:
            level = None if priority is None else priority()
            timeout = None if deadline is None else deadline(level)
            inputs = self._inputs(parse(), many)
        except Exception as exc:
            return self.parse_failed(name, exc, span, client)
        future: Optional[BatchFuture] = None
        try:
            if level is None and timeout is None:
                future = streamer().submit(inputs)
            else:
                future = streamer().submit(inputs, timeout, level)
            outputs = wait_call(future, client)
            response = respond(outputs if many is not None else outputs[0])
            if inspect.isawaitable(response):
                raise TypeError(
                    f"the respond hook of {self.noun} {name} returned an awaitable in a sync view: "
                    "respond synchronously, or make the view async"
                )
        except Exception as exc:
            return self.error(name, exc, _failed_input(future, many), span)
        answer: R = response
        return answer

    async def aserve(
        self,
        name: str,
        streamer: Callable[[], BaseStreamer | Awaitable[BaseStreamer]],
        parse: Callable[[], Any],
        respond: Callable[[Any], Any],
        draining: bool = False,
        many: Optional[int] = None,
        traced: Optional[Traced] = None,
        priority: Optional[Callable[[], Optional[int]]] = None,
        deadline: Optional[Deadline] = None,
    ) -> R:
        """:meth:`serve` for an async view: ``parse``, ``streamer`` and
        ``respond`` may each return an awaitable, and the call is awaited
        without blocking the event loop; cancelling the awaiting task (as
        Django does when the ASGI server says the client disconnected) gives
        the call up, counted as ``disconnected``."""
        if traced is None or tracing.silent():
            return await self._aserve(name, streamer, parse, respond, draining, many, None, priority, deadline)
        request = tracing.request_span(traced[0], traced[1], name)
        with request as span:
            if not span.is_recording():
                return await self._aserve(name, streamer, parse, respond, draining, many, None, priority, deadline)
            return await self._aserve(
                name,
                streamer,
                _in_span_async("parse", parse, request),
                _in_span_async("respond", respond, request),
                draining,
                many,
                span,
                priority,
                deadline,
            )

    async def _aserve(
        self,
        name: str,
        streamer: Callable[[], BaseStreamer | Awaitable[BaseStreamer]],
        parse: Callable[[], Any],
        respond: Callable[[Any], Any],
        draining: bool,
        many: Optional[int],
        span: Optional[Span],
        priority: Optional[Callable[[], Optional[int]]] = None,
        deadline: Optional[Deadline] = None,
    ) -> R:
        if draining:
            return self.refuse_while_draining(name, span)
        try:
            level = None if priority is None else priority()
            timeout = None if deadline is None else deadline(level)
            parsed = parse()
            if inspect.isawaitable(parsed):
                parsed = await parsed
            inputs = self._inputs(parsed, many)
        except Exception as exc:
            return self.parse_failed(name, exc, span)
        future: Optional[BatchFuture] = None
        try:
            running = streamer()
            if inspect.isawaitable(running):
                running = await running
            if level is None and timeout is None:
                future = running.submit(inputs)
            else:
                future = running.submit(inputs, timeout, level)
            outputs = await await_call(future)
            response = respond(outputs if many is not None else outputs[0])
            if inspect.isawaitable(response):
                response = await response
        except Exception as exc:
            return self.error(name, exc, _failed_input(future, many), span)
        answer: R = response
        return answer

    @staticmethod
    def _inputs(parsed: Any, many: Optional[int]) -> List[Any]:
        return [parsed] if many is None else inputs_of(parsed, many)

    # -- its failures ------------------------------------------------------------

    def error(
        self, name: str, exc: BaseException, failed_input: Optional[int] = None, span: Optional[Span] = None
    ) -> R:
        """The response for ``exc``: its status by
        :func:`~streamer_core.web.http.status_for`; a 500 logged with its
        traceback and a new error id, which the client gets (and, where
        ``details()`` says so, the exception's type and message); a 503 or 504 logged by
        :func:`~streamer_core.web.http.log_unavailable`. ``failed_input``:
        the index of the input of the request it is the error of, named in
        the message and given as ``"input"``; ``span``: the request's, when
        traced, which records the status."""
        status = status_for(exc)
        made = error_id() if status == 500 else None
        details = self.details() if self.details is not None else None
        status, body, headers = error_response(exc, debug=self.debug(), details=details, error_id=made)
        if span is not None:
            from ..telemetry.tracing import mark_status

            mark_status(span, status, exc)
        if failed_input is not None:
            error = body["error"]
            error["message"] = f"input {failed_input}: {error['message']}"
            error["input"] = failed_input
        if status == 500:
            self.log.error("%s %s failed (error id %s)", self.noun, name, made, exc_info=exc)
        elif status > 500:
            log_unavailable(self.log, f"{self.noun} {name}", status, exc)
        return self.reply(status, body, headers)

    def parse_failed(self, name: str, exc: Exception, span: Optional[Span] = None, client: Optional[Any] = None) -> R:
        """The response when parsing the request raised ``exc``: an
        :class:`InvalidInput` as it is (400, or its own status); what the
        framework raised reading the body, as :attr:`read_error` says; a
        ``ValueError``, ``TypeError`` or ``KeyError`` as a 400; anything else
        as a 500 (the parse hook's own fault, logged). A 400 whose client
        has closed its socket (``client``, where the server gives it) is a
        :class:`ClientDisconnected`: a body cut short, read by a parse hook
        of the app's own, is no invalid input. Counted as the call's
        outcome: it never reaches the streamer."""
        problem: BaseException
        if isinstance(exc, InvalidInput):
            problem = exc
        else:
            problem = self.read_error(exc) or exc
            if problem is exc and isinstance(exc, (ValueError, TypeError, KeyError)):
                problem = InvalidInput(f"the request could not be parsed: {exc}")
            if problem is not exc:
                problem.__cause__ = exc
        if client is not None and status_for(problem) == 400 and peer_closed(client):
            gone = ClientDisconnected(f"the client closed its connection; its request could not be parsed: {problem}")
            gone.__cause__, problem = problem, gone
        stats_for(name).failed(problem)
        return self.error(name, problem, span=span)

    def refuse_while_draining(self, name: str, span: Optional[Span] = None) -> R:
        """503 with ``Retry-After``: this process is shutting down."""
        stats_for(name).finished("unavailable")
        refusal = StreamerClosedError("this server is shutting down; retry another")
        status, body, headers = error_response(refusal)
        if span is not None:
            from ..telemetry.tracing import mark_status

            mark_status(span, status, refusal)
        return self.reply(status, body, headers)


def _in_span(name: str, step: Callable[..., Any], request: tracing.Step) -> Callable[..., Any]:
    """``step`` (parse, respond), run in a child span ``name`` of the request's."""

    def run(*args: Any) -> Any:
        with tracing.step(name, request):
            return step(*args)

    return run


def _in_span_async(name: str, step: Callable[..., Any], request: tracing.Step) -> Callable[..., Any]:
    """:func:`_in_span` for an async view's hooks, which may return an awaitable:
    the span lasts until it is awaited."""

    async def run(*args: Any) -> Any:
        with tracing.step(name, request):
            value = step(*args)
            if inspect.isawaitable(value):
                value = await value
            return value

    return run


def _failed_input(future: Optional[BatchFuture], many: Optional[int]) -> Optional[int]:
    """Which input of a request of many its call failed for, if one did."""
    return future.failed_input if future is not None and many is not None else None
