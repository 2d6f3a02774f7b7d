"""Batched views (README.md, docs/django.md): tests/test_docs.py serves them
with the settings of django_settings.py and posts to them."""

# ruff: noqa: E402, I001  (imports as the docs show them)

from django.http import JsonResponse

# --8<-- [start:views]
from django_streamer import batched_view, get_streamer, request_item


@batched_view("embed")  # parse -> batch -> JSON, with the same HTTP mapping as Flask
def stream(request):
    return request_item(request, "s")  # JSON {"s": ...}, the form field s, or the uploaded file s as bytes


@batched_view("embed")  # under ASGI: awaits without blocking the event loop
async def astream(request):
    return request_item(request, "s")


def similar(request):  # any view of yours
    vectors = get_streamer("embed").predict(["a sentence"])
    return JsonResponse({"vectors": vectors})


# --8<-- [end:views]
