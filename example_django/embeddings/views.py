"""The example's endpoints: /naive calls the embedding model once per
request, /stream and /astream batch concurrent requests through
django_streamer, and /classify batches uploaded images."""

from __future__ import annotations

import logging
from typing import Any, Dict

from django.conf import settings
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.csrf import csrf_exempt

from django_streamer import batched_view, conf, get_streamer, json_error, request_item, request_upload
from example_models.embedding import embed, names_of, sentence_of
from example_models.openai_api import method_not_allowed, models_reply, serve_embeddings
from example_models.vision import image_upload
from streamer_core.errors import MethodNotAllowed
from streamer_core.web.deadline import EndpointDeadline, environ_headers
from streamer_core.web.http import dumps_json

from .naive import naive_model

log = logging.getLogger("django_streamer")


def parse_sentence(request: HttpRequest) -> str:
    """The sentence of a request: JSON ``{"s": ...}``, the form field ``s``
    or a text file ``s`` (a 400 otherwise), as example_flask reads it."""
    return sentence_of(request_item(request, "s"))


@batched_view("embed")
def stream(request: HttpRequest) -> str:
    """Batched: the sentence joins others' in one model call."""
    return parse_sentence(request)


@batched_view("embed")
async def astream(request: HttpRequest) -> str:
    """Batched, as an async view: under uvicorn it awaits without blocking the event loop."""
    return parse_sentence(request)


@batched_view("classify")
def classify(request: HttpRequest) -> object:
    """An uploaded image (``curl -F "file=@cat.jpg"``), checked by its first
    bytes here, then decoded and classified in a batch with others
    (``example_models.vision``): its top classes as JSON."""
    return image_upload(request_upload(request, "file"))


@csrf_exempt
def naive(request: HttpRequest) -> HttpResponse:
    """The same model, called once per request: what /stream is compared
    with. Its request is read by the same rules (the body limit, the media
    types, the JSON errors, a JSON 405 for another method)."""
    try:
        if request.method != "POST":
            raise MethodNotAllowed(str(request.method), ["POST"])
        sentence = parse_sentence(request)
        return HttpResponse(dumps_json(embed(naive_model(), [sentence])[0]), content_type="application/json")
    except Exception as exc:
        return json_error(exc, "naive")


@csrf_exempt
def embeddings(request: HttpRequest) -> HttpResponse:
    """OpenAI's embeddings API on /stream's model (example_models.openai_api)."""
    if request.method != "POST":
        return _answer(*method_not_allowed(str(request.method), ["POST"]))
    served = names_of(settings.EMBEDDING_MODEL)
    embed = lambda: get_streamer("embed")  # noqa: E731
    # The client's deadline header, read as the project's batched views read it.
    deadline = EndpointDeadline.checked(conf.timeout_header(), conf.envoy_timeout(), "/v1/embeddings")
    timed = lambda config: deadline.timeout(environ_headers(request.META), config)  # noqa: E731
    return _answer(*serve_embeddings(lambda: request_item(request), embed, served, log, settings.DEBUG, timed))


@csrf_exempt  # another method gets the API's 405, not the CSRF check's 403 page
def models(request: HttpRequest) -> HttpResponse:
    if request.method not in ("GET", "HEAD"):
        return _answer(*method_not_allowed(str(request.method), ["GET"]))
    return _answer(200, models_reply(names_of(settings.EMBEDDING_MODEL)[0]), {})


def _answer(status: int, body: Dict[str, Any], headers: Dict[str, str]) -> HttpResponse:
    """A reply of the OpenAI API (example_models.openai_api) as a response."""
    response = HttpResponse(dumps_json(body), status=status, content_type="application/json")
    for name, value in headers.items():
        response[name] = value
    return response


def index(request: HttpRequest) -> HttpResponse:
    if request.method not in ("GET", "HEAD"):
        return json_error(MethodNotAllowed(str(request.method), ["GET"]), "index")
    return JsonResponse(
        {
            "endpoints": {
                "POST /naive": "one model call per request",
                "POST /stream": "batched",
                "POST /v1/embeddings": "OpenAI's embeddings API, batched (openai.OpenAI(base_url=.../v1))",
                "GET /v1/models": "the model served, as OpenAI's API lists models",
                "POST /astream": "batched, async (ASGI)",
                "POST /classify": 'an image, batched: curl -F "file=@cat.jpg" .../classify',
                "GET /metrics": "Prometheus metrics",
                "GET /healthz": "liveness",
                "GET /readyz": "readiness: 200 once the model can serve",
            },
            "backend": settings.STREAMER["BACKEND"],
            "model": settings.EMBEDDING_MODEL,
            "image_model": settings.IMAGE_MODEL,
        }
    )
