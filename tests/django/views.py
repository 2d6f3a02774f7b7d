"""The test project's views, one of each form of batched view."""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest, HttpResponse, JsonResponse

from django_streamer import (
    AsyncBatchedView,
    BatchedView,
    InvalidInput,
    batched_view,
    get_streamer,
    request_inputs,
    request_item,
)


@batched_view("double")
def double(request: HttpRequest) -> Any:
    """The JSON body or form field "x"; a number, or a string the model may refuse."""
    x = request_item(request, "x")
    if isinstance(x, str) and x.isdigit():
        return int(x)
    if isinstance(x, bool) or not isinstance(x, (int, float, str)):
        raise InvalidInput('"x" must be a number or a string')
    return x


@batched_view("double")
async def adouble(request: HttpRequest) -> Any:
    return request_item(request, "x")


async def respond_in_a_span(output: Any) -> Any:
    """An async respond hook that makes a span of its own and awaits inside it."""
    import asyncio

    from opentelemetry import trace

    with trace.get_tracer("tests").start_as_current_span("encode"):
        await asyncio.sleep(0.02)
        return JsonResponse({"doubled": output})


@batched_view("double", respond=respond_in_a_span)
async def arespond_traced(request: HttpRequest) -> Any:
    return request_item(request, "x")


@batched_view("double", respond=lambda output: JsonResponse({"doubled": output}), methods=["POST", "PUT"])
def wrapped(request: HttpRequest, x: int) -> Any:
    """The input from the URL; answered in an object of our own."""
    return x


@batched_view("sizes")
async def asizes(request: HttpRequest) -> Any:
    return request_item(request, "x")


vectors = BatchedView.as_view(model="vectors", field="n")


class Sizes(AsyncBatchedView):
    model = "sizes"
    field = "x"


def direct(request: HttpRequest) -> HttpResponse:
    """A view of our own calling the streamer."""
    return JsonResponse({"outputs": get_streamer("double").predict([1, 2, 3])})


double_cbv = BatchedView.as_view(model="double", field="x")
upload = BatchedView.as_view(model="uploads", field="file")
double_guarded = BatchedView.as_view(model="double", field="x", csrf_exempt=False)
pid = BatchedView.as_view(model="pid", field="x")
hold = BatchedView.as_view(model="hold", field="x")


@batched_view("double")
def broken_parse(request: HttpRequest) -> Any:
    """A parse function with a bug of its own."""
    raise RuntimeError("the parse function has a bug")


@batched_view("double", respond=lambda output: 1 / 0)
def broken_respond(request: HttpRequest) -> Any:
    return request_item(request, "x")


@batched_view("double", csrf_exempt=False)
def guarded(request: HttpRequest) -> Any:
    return request_item(request, "x")


@batched_view("pid")
def unpicklable(request: HttpRequest) -> Any:
    """A parse function returning a value that cannot cross to a worker process."""
    import threading

    return threading.Lock()


def process(request: HttpRequest) -> HttpResponse:
    """What the server's hooks made of this process: its frozen objects,
    the collector's thresholds, its cores."""
    import gc
    import os

    return JsonResponse(
        {"frozen": gc.get_freeze_count(), "threshold": gc.get_threshold(), "cores": sorted(os.sched_getaffinity(0))}
    )


@batched_view("double", many=True)
def double_many(request: HttpRequest) -> Any:
    """A JSON array of numbers, or every value of the form field "x"."""
    return [
        int(x) if isinstance(x, str) and x.isdigit() else x
        for x in request_inputs(request, "x" if request.POST else None)
    ]


@batched_view("double", many=True, max_inputs=3)
async def adouble_many(request: HttpRequest) -> Any:
    return request_inputs(request)


double_many_cbv = BatchedView.as_view(model="double", many=True)
double_few_cbv = BatchedView.as_view(model="double", many=True, max_inputs=2)


@batched_view("gate")
async def agate(request: HttpRequest) -> Any:
    """The JSON body, to tests.core.models.RecordingGate."""
    return request_item(request)


@batched_view("gate")
def gate(request: HttpRequest) -> Any:
    return request_item(request)


def gate_dropped(request: HttpRequest) -> HttpResponse:
    """The gate model's inputs dropped unrun in this process, by reason."""
    from streamer_core.telemetry.stats import stats_for

    return JsonResponse(stats_for("gate").snapshot().dropped)


def gate_outcomes(request: HttpRequest) -> HttpResponse:
    """The gate model's calls in this process, by outcome."""
    from streamer_core.telemetry.stats import stats_for

    return JsonResponse(stats_for("gate").snapshot().requests)


# The model "ranked" of tests/django/test_priority.py (two levels), at each level, by each form of view.
@batched_view("ranked", priority=1)
def ranked_search(request: HttpRequest) -> Any:
    return request_item(request)


@batched_view("ranked", priority_header=True)
async def aranked_header(request: HttpRequest) -> Any:
    """Level by the X-Priority header; without one, the model's default."""
    return request_item(request)


ranked_bulk = BatchedView.as_view(model="ranked", priority=2)
ranked_named_header = AsyncBatchedView.as_view(model="ranked", priority_header="X-Request-Priority")
