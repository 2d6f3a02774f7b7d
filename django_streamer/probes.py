"""The operations views: Prometheus metrics, liveness and readiness.

Served by ``path("", include("django_streamer.urls"))`` at ``metrics``,
``healthz`` and ``readyz``; each is a plain view, to mount elsewhere too.
"""

from __future__ import annotations

from django.core.exceptions import ImproperlyConfigured
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.http import require_GET

from streamer_core.telemetry import metrics
from streamer_core.web import probes
from streamer_core.web.http import error_body

from .registry import all_handles, draining
from .views import json_reply

__all__ = ["metrics_view", "health_view", "ready_view"]


@require_GET
def metrics_view(request: HttpRequest) -> HttpResponse:
    """Every model's metrics in Prometheus's text format (every web process's
    under ``PROMETHEUS_MULTIPROC_DIR``); 501 without ``prometheus_client``."""
    try:
        body, content_type = metrics.exposition()
    except RuntimeError as exc:
        return JsonResponse(error_body(501, "MetricsUnavailable", str(exc)), status=501)
    return HttpResponse(body, content_type=content_type)


@require_GET
def health_view(request: HttpRequest) -> JsonResponse:
    """Liveness: 200 while this process serves."""
    return json_reply(*probes.liveness())


@require_GET
def ready_view(request: HttpRequest) -> JsonResponse:
    """Readiness: 200 when every model of ``STREAMER["MODELS"]`` can serve a
    call now, else 503 (with ``Retry-After``) naming each that cannot, and why."""
    try:
        handles = all_handles()
    except ImproperlyConfigured as exc:
        return json_reply(*probes.unready(exc))
    return json_reply(*probes.readiness(handles, draining()))
