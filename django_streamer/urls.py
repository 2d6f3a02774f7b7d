"""``path("", include("django_streamer.urls"))``: the operations routes,
``metrics`` (Prometheus), ``healthz`` (liveness) and ``readyz`` (readiness).
Mount them under a prefix of your own by including them there instead."""

from django.urls import path

from .probes import health_view, metrics_view, ready_view

app_name = "django_streamer"

urlpatterns = [
    path("metrics", metrics_view, name="metrics"),
    path("healthz", health_view, name="health"),
    path("readyz", ready_view, name="ready"),
]
