"""A Flask request's model inputs by a batched route's default rule, for
views and parse hooks of the app's own: :func:`request_item`,
:func:`request_inputs`, :func:`request_upload` and :func:`json_body`."""

from __future__ import annotations

from typing import Any, Optional

from flask import current_app, request

from streamer_core.web.body import default_input, json_of, upload_of
from streamer_core.web.http import MISSING

from .reading import body_of, limit_request_body, loads_of
from .state import state_of

__all__ = ["json_body", "request_inputs", "request_item", "request_upload"]


def json_body() -> Any:
    """The current request's JSON body, or :data:`~streamer_core.web.http.MISSING`
    when it is not a JSON request. Raises :class:`InvalidInput` saying what is
    wrong with a malformed body (one nested too deep included). Read by
    orjson where it is installed and the app keeps Flask's own JSON
    provider, else by the app's provider."""
    req = request._get_current_object()  # type: ignore[attr-defined]
    if not req.is_json:
        return MISSING
    return json_of(req.get_data(cache=True), loads_of(current_app._get_current_object()))  # type: ignore[attr-defined]


def request_item(field: Optional[str] = None) -> Any:
    """The current request's model input by the default rule of a batched
    route: the JSON body (its key ``field`` when given), else the form field
    ``field``, else the uploaded file ``field`` as ``bytes`` (``curl -F
    "file=@cat.jpg"``): for a route's ``parse`` hook that checks or
    converts the input::

        def parse(req):
            return decode_image(request_item("file"))

    Raises :class:`InvalidInput` (400) saying what to send,
    :class:`PayloadTooLarge` (413) for a body over the route's
    ``max_body_bytes`` (in a view of your own, ``STREAMER_MAX_BODY_BYTES``),
    sent with a ``Content-Length`` or in chunks, and
    :class:`UnsupportedMediaType` (415) for a body that is neither JSON nor
    a form."""
    req = request._get_current_object()  # type: ignore[attr-defined]
    app = current_app._get_current_object()  # type: ignore[attr-defined]
    limit = limit_request_body(req, app, state_of(app).max_body_bytes)
    return default_input(body_of(req), field, limit, loads_of(app))


def request_inputs(field: Optional[str] = None) -> Any:
    """The current request's inputs by the default rule of a ``many=True``
    route: the JSON array (its key ``field`` when given), else every value
    of the form field ``field``, else every uploaded file of it as
    ``bytes``: for such a route's ``parse`` hook. Raises as
    :func:`request_item` does; the route checks it is a list of at most
    ``max_inputs``."""
    req = request._get_current_object()  # type: ignore[attr-defined]
    app = current_app._get_current_object()  # type: ignore[attr-defined]
    limit = limit_request_body(req, app, state_of(app).max_body_bytes)
    return default_input(body_of(req), field, limit, loads_of(app), many=True)


def request_upload(field: str = "file") -> bytes:
    """The bytes of the current request's uploaded file ``field``, for a
    route that takes a file and nothing else (``curl -F "file=@cat.jpg"``)::

        def parse(req):
            return decode_image(request_upload("file"))

    Unlike :func:`request_item`, it never tells a client to send JSON: a
    body that is not a multipart form is a 415, no body, a text field or a
    form without the file a 400, each saying how to send the file; a file
    over the route's ``max_body_bytes`` a 413."""
    req = request._get_current_object()  # type: ignore[attr-defined]
    app = current_app._get_current_object()  # type: ignore[attr-defined]
    limit = limit_request_body(req, app, state_of(app).max_body_bytes)
    return upload_of(body_of(req), field, limit)
