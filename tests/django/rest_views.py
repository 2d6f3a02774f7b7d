"""The test project's batched API views (Django REST framework), served at
``rest/...``: a program known by its key (``Authorization: Key secret``),
a permission only staff pass, a throttle of three calls a minute, DRF's
session authentication, a serializer's validation, many inputs, uploads."""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple

from django.http import HttpRequest, JsonResponse
from django.urls import URLPattern, path
from rest_framework import serializers
from rest_framework.authentication import BaseAuthentication, SessionAuthentication
from rest_framework.exceptions import APIException, AuthenticationFailed
from rest_framework.parsers import MultiPartParser
from rest_framework.permissions import IsAdminUser, IsAuthenticated
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.throttling import SimpleRateThrottle
from rest_framework.views import exception_handler

from django_streamer.rest import BatchedAPIView


class Program:
    """The caller a key authenticates: a program, not a user of the site's."""

    is_authenticated = True
    is_staff = False
    pk = "program"


class KeyAuthentication(BaseAuthentication):
    def authenticate(self, request: Request) -> Optional[Tuple[Any, Any]]:
        header = request.META.get("HTTP_AUTHORIZATION", "")
        if not header.startswith("Key "):
            return None
        if header[4:] != "secret":
            raise AuthenticationFailed("unknown key")
        return Program(), None

    def authenticate_header(self, request: Request) -> str:
        return "Key"


class ThreeAMinute(SimpleRateThrottle):
    """Three calls a minute, counted by the ``X-Caller`` header (a test's own)."""

    rate = "3/min"

    def get_cache_key(self, request: Request, view: Any) -> str:
        return f"tests-throttle-{request.headers.get('X-Caller', '')}"


class Double(BatchedAPIView):
    model = "double"
    field = "x"
    authentication_classes = [KeyAuthentication]
    permission_classes = [IsAuthenticated]
    throttle_classes: List[Any] = []


class StaffDouble(Double):
    permission_classes = [IsAdminUser]


class ThrottledDouble(Double):
    throttle_classes = [ThreeAMinute]


class SessionDouble(Double):
    authentication_classes = [SessionAuthentication]


class Open(BatchedAPIView):
    """No authentication: the shapes of DRF's and the streamer's errors."""

    model = "double"
    field = "x"
    authentication_classes: List[Any] = []
    permission_classes: List[Any] = []
    throttle_classes: List[Any] = []


class Sentence(serializers.Serializer):
    s = serializers.CharField(max_length=8)


class Validated(Open):
    """A serializer validates the input: its field errors are DRF's 400."""

    def parse(self, request: Request, *args: Any, **kwargs: Any) -> Any:
        sentence = Sentence(data=request.data)
        sentence.is_valid(raise_exception=True)
        return sentence.validated_data["s"]


class Upload(Open):
    model = "uploads"
    field = "file"
    parser_classes = [MultiPartParser]


def coded(exc: Exception, context: Dict[str, Any]) -> Optional[Response]:
    """An ``EXCEPTION_HANDLER`` that adds each error's code to DRF's answer."""
    response = exception_handler(exc, context)
    if response is not None and isinstance(exc, APIException):
        response.data["code"] = exc.get_codes()
    return response


def outcomes(request: HttpRequest, model: str) -> JsonResponse:
    """The model's calls in this process, by outcome."""
    from streamer_core.telemetry.stats import stats_for

    return JsonResponse(stats_for(model).snapshot().requests)


urlpatterns: List[URLPattern] = [
    path("double", Double.as_view()),
    path("staff", StaffDouble.as_view()),
    path("throttled", ThrottledDouble.as_view()),
    path("session", SessionDouble.as_view()),
    path("open", Open.as_view()),
    path("whole", Open.as_view(field=None)),
    path("many", Open.as_view(many=True, field=None, max_inputs=3)),
    path("many-x", Open.as_view(many=True)),
    path("sizes", Open.as_view(model="sizes", field=None)),
    path("vectors", Open.as_view(model="vectors", field="n")),
    path("validated", Validated.as_view()),
    path("upload", Upload.as_view()),
    path("ranked", Open.as_view(model="ranked", field=None, priority_header=True)),
    path("outcomes/<str:model>", outcomes),
]
