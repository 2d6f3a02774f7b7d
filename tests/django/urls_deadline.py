"""Views of the model ``slow`` in each form, for the deadline tests
(``ROOT_URLCONF`` of those tests only): a function view, an async one, a
class view, the DRF view; ``/envoy`` reads Envoy's header too, ``/deaf``
reads none, and so do their class-view and DRF forms."""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest
from django.urls import path

from django_streamer import AsyncBatchedView, BatchedView, batched_view, request_item
from django_streamer.rest import BatchedAPIView


@batched_view("slow")
def slow(request: HttpRequest) -> Any:
    return request_item(request, "x")


@batched_view("slow")
async def aslow(request: HttpRequest) -> Any:
    return request_item(request, "x")


@batched_view("slow", envoy_timeout=True)
def envoy(request: HttpRequest) -> Any:
    return request_item(request, "x")


@batched_view("slow", timeout_header=None)
def deaf(request: HttpRequest) -> Any:
    return request_item(request, "x")


urlpatterns = [
    path("slow", slow),
    path("aslow", aslow),
    path("slow-cbv", BatchedView.as_view(model="slow", field="x")),
    path("aslow-cbv", AsyncBatchedView.as_view(model="slow", field="x")),
    path("rest-slow", BatchedAPIView.as_view(model="slow", field="x")),
    path("envoy", envoy),
    path("deaf", deaf),
    # The same two choices as each class view's own options (as_view), over the project's.
    path("envoy-cbv", BatchedView.as_view(model="slow", field="x", envoy_timeout=True)),
    path("aenvoy-cbv", AsyncBatchedView.as_view(model="slow", field="x", envoy_timeout=True)),
    path("rest-envoy", BatchedAPIView.as_view(model="slow", field="x", envoy_timeout=True)),
    path("deaf-cbv", BatchedView.as_view(model="slow", field="x", timeout_header=None)),
    path("adeaf-cbv", AsyncBatchedView.as_view(model="slow", field="x", timeout_header=None)),
    path("rest-deaf", BatchedAPIView.as_view(model="slow", field="x", timeout_header=None)),
]
