"""The batched view as a Django REST framework view, for a project whose API
is DRF's: its authentication, permission and throttle classes run before
the body is parsed or anything queued, its parsers read the body (``request.data``),
and every error is answered as DRF answers an exception::

    from django_streamer.rest import BatchedAPIView

    class Embed(BatchedAPIView):
        model = "embed"
        field = "s"                                    # {"s": ...}; None: the whole body
        authentication_classes = [TokenAuthentication]
        permission_classes = [IsAuthenticated]
        throttle_classes = [UserRateThrottle]

    path("embed", Embed.as_view())

A request is answered as :class:`~django_streamer.views.BatchedView`
answers it, in DRF's shapes: a body DRF cannot parse is its 400 or 415
(``{"detail": ...}``), an input ``field`` lacks a 400 of field errors
(``{"s": ["This field is required."]}``), a refused credential a 401 or
403, a throttled request a 429 with ``Retry-After``; the streamer's
failures keep the project's statuses (500 for this input, 504 on timeout,
503 with ``Retry-After`` when the queue is full, no worker can start or the
server is draining), each as ``{"detail": message}``, its code the
project's error type (``exc.get_codes()`` in an ``EXCEPTION_HANDLER``).

DRF's views are sync: serve this one under a WSGI server (gunicorn with
``--threads``), where the requests of a process's threads are batched
together. As every DRF view it is exempt from Django's CSRF middleware, and
DRF's ``SessionAuthentication`` checks the token of every request a session
authenticates. Importing this module imports DRF; the rest of the package
does not.
"""

from __future__ import annotations

import io
from typing import TYPE_CHECKING, Any, Dict, Optional, Union

from django.core.files.uploadedfile import UploadedFile
from django.http import QueryDict
from django.utils.decorators import classonlymethod
from rest_framework import exceptions
from rest_framework.fields import Field
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.settings import api_settings
from rest_framework.views import APIView

from streamer_core.telemetry.stats import stats_for
from streamer_core.web.cycle import Cycle
from streamer_core.web.peer import client_socket

from . import conf
from .conf import max_body_bytes
from .reading import body_length, read_error
from .registry import draining, get_streamer
from .view_options import BatchedOptions, deadline_of, debug, level_of, logger, mark, traced

if TYPE_CHECKING:
    from opentelemetry.trace import Span

__all__ = ["BatchedAPIView", "StreamerAPIError"]


class StreamerAPIError(exceptions.APIException):
    """An error of the request cycle (the streamer's failure, a body over
    ``MAX_BODY_BYTES``) as a DRF exception: its status, ``{"detail":
    message}``, the project's error type as its code, and ``Retry-After``
    on a 503 (DRF's handler sends ``wait`` so). A 500 carries its error
    id beside the detail (``{"detail": "internal error", "id": ...}``)."""

    def __init__(
        self, status: int, kind: str, message: str, headers: Dict[str, str], error_id: Optional[str] = None
    ) -> None:
        detail: Any = message if error_id is None else {"detail": message, "id": error_id}
        super().__init__(detail=detail, code=kind)
        self.status_code = status
        retry = headers.get("Retry-After")
        self.wait = int(retry) if retry is not None else None


def _reply(status: int, body: Dict[str, Any], headers: Dict[str, str]) -> StreamerAPIError:
    error = body["error"]
    return StreamerAPIError(status, error["type"], error["message"], headers, error.get("id"))


Answer = Union[Response, exceptions.APIException]


class _RestCycle(Cycle[Answer]):
    """The request cycle, whose parse step's DRF exceptions (a body DRF's
    parsers refuse, a serializer's field errors) are answered by DRF as they
    are, counted as the call's outcome."""

    def parse_failed(
        self, name: str, exc: Exception, span: Optional[Span] = None, client: Optional[Any] = None
    ) -> Answer:
        if not isinstance(exc, exceptions.APIException):
            return super().parse_failed(name, exc, span, client)
        stats_for(name).finished("invalid" if exc.status_code < 500 else "model_error")
        if span is not None:
            from streamer_core.telemetry.tracing import mark_status

            mark_status(span, exc.status_code, exc)
        return exc


_CYCLE = _RestCycle(_reply, logger, "the batched API view of", debug, read_error, conf.error_details)


def _value(value: Any) -> Any:
    """A value of DRF's parsed data as a model input: an uploaded file as its bytes."""
    return value.read() if isinstance(value, UploadedFile) else value


class BatchedAPIView(BatchedOptions, APIView):
    """A DRF view whose ``POST`` runs the model input of ``request.data``
    (:meth:`parse`) through the model ``model`` with other requests' inputs
    and answers :meth:`respond`'s ``Response``. Set DRF's
    ``authentication_classes``, ``permission_classes``,
    ``throttle_classes`` and ``parser_classes`` as on any ``APIView``."""

    _noun = "the batched API view of"

    def parse(self, request: Request, *args: Any, **kwargs: Any) -> Any:
        """The model input of ``request`` (with ``many``, the list of its
        inputs): ``request.data``, or its key ``field`` (every value of a
        form field, with ``many``); an uploaded file as its bytes. Raise a
        DRF exception (``ValidationError``) for a 400 in DRF's shape; a
        serializer's ``is_valid(raise_exception=True)`` does."""
        data = request.data
        field = self.field
        if field is None:
            if request.stream is None:  # no body: DRF's data is an empty {}
                raise exceptions.ParseError("send the input as the body, e.g. JSON")
            if isinstance(data, QueryDict):
                return {key: _value(data[key]) for key in data}
            return data
        if not isinstance(data, dict):  # a QueryDict is one
            kind = "a list" if isinstance(data, list) else type(data).__name__
            message = f'send an object with the key "{field}", not {kind}'
            raise exceptions.ValidationError({api_settings.NON_FIELD_ERRORS_KEY: [message]})
        if field not in data:
            raise exceptions.ValidationError({field: [Field.default_error_messages["required"]]})
        if self.many and isinstance(data, QueryDict):
            return [_value(value) for value in data.getlist(field)]
        return _value(data[field])

    def respond(self, output: Any) -> Response:
        """The response for the model's ``output`` (with ``many``, the list
        of outputs); by default it as the body, rendered by DRF's renderers
        (NumPy arrays and tensors as lists)."""
        return Response(output)

    def post(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        model = self.model
        assert model is not None  # as_view checked it
        django_request = request._request
        answer = _CYCLE.serve(
            model,
            lambda: get_streamer(model),
            lambda: self._parse_within_limit(request, *args, **kwargs),
            self.respond,
            draining(),
            self._most(),
            traced(django_request, model),
            client_socket(django_request.META),
            level_of(django_request, model, self._priority()),
            deadline_of(django_request, model, self.timeout_header, self.envoy_timeout),
        )
        if isinstance(answer, exceptions.APIException):
            raise answer  # answered by DRF's exception handler (EXCEPTION_HANDLER)
        return answer

    def _parse_within_limit(self, request: Request, *args: Any, **kwargs: Any) -> Any:
        """:meth:`parse`, once the body is known to be within
        ``STREAMER["MAX_BODY_BYTES"]`` (a 413 before it is read; one sent in
        chunks is read here, as the batched views read it)."""
        django_request = request._request
        body_length(django_request, max_body_bytes())
        if hasattr(django_request, "_body") and not getattr(
            django_request, "_read_started", False
        ):  # read in chunks: DRF reads it here
            django_request._stream = io.BytesIO(django_request._body)
        return self.parse(request, *args, **kwargs)

    @classonlymethod
    def as_view(cls, **initkwargs: Any) -> Any:
        model, priority = cls.checked_options(initkwargs)
        view = super().as_view(**initkwargs)
        mark(view, model, priority)
        return view
