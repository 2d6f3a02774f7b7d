"""How a batched endpoint reads its request, whatever the framework: the
body limit, and the default rule that makes a model input of a request.

Each framework layer describes a request in a few lines (a
:class:`RequestBody`: its media type and length, reading it whole, its
form by the framework's own parser) and calls :func:`limit_body` and
:func:`default_input`; the rule and its messages are written here once.
"""

from __future__ import annotations

from typing import Any, Callable, List, Mapping, NamedTuple, Optional, Protocol, Tuple

from ..errors import InvalidInput, PayloadTooLarge, UnsupportedMediaType
from ..options.config import OPTIONS
from .http import (
    MISSING,
    check_body_size,
    check_media_type,
    check_read_size,
    is_json_type,
    item_from_request,
    read_upload,
    refuse_undecoded_chunks,
)
from .multipart import parse_form

__all__ = [
    "READ_WHOLE_BYTES",
    "FormLimits",
    "RequestBody",
    "check_many",
    "default_input",
    "inputs_of",
    "json_of",
    "limit_body",
    "upload_of",
]

#: A multipart body up to this size is read whole and cut at its boundaries
#: in C (:mod:`streamer_core.web.multipart`) rather than by the framework's
#: parser, which costs a few times the CPU for the same upload (the docs'
#: Performance page).
READ_WHOLE_BYTES = 1 << 20


class FormLimits(NamedTuple):
    """The framework's own limits on a form, which hold on the fast path too:
    the most parts (fields and files), the most bytes of a field."""

    max_parts: Optional[int]
    max_field_bytes: Optional[int] = None


class RequestBody(Protocol):
    """A request, as the default rule reads it: what each framework layer
    tells of its own request object."""

    #: The media type, lower case, without its parameters.
    media_type: str
    #: Its ``Content-Length``; ``None`` when it was not sent.
    content_length: Optional[int]
    #: Sent in chunks (``Transfer-Encoding: chunked``, no ``Content-Length``).
    chunked: bool
    #: Whether a form body is read at all (Django reads one for POST only).
    reads_form: bool

    def data(self) -> bytes:
        """The whole body, read once (then kept for the framework's own parsing)."""

    def boundary(self) -> str:
        """The multipart boundary of its media type's parameters."""

    def form_limits(self) -> Optional[FormLimits]:
        """The framework's limits for the fast form path, or ``None`` where
        its own parser must read the form (so its settings and errors apply)."""

    def parsed_form(self) -> Tuple[Mapping[str, Any], Mapping[str, Any]]:
        """The fields and files as the framework's own parser reads them."""


def json_of(data: bytes, loads: Callable[[bytes], Any]) -> Any:
    """A JSON body read by ``loads``; :class:`InvalidInput` (400) saying what
    is wrong with a malformed one, one nested too deep included."""
    try:
        return loads(data)
    except ValueError as exc:
        try:
            data.decode("utf-8")
        except UnicodeDecodeError as bad:  # a decoder's own words for it are obscure
            raise InvalidInput(
                f"the body is not valid JSON: it is not UTF-8 (byte 0x{data[bad.start]:02x} at {bad.start}); "
                "JSON is sent in UTF-8 whatever the charset of its Content-Type"
            ) from exc
        raise InvalidInput(f"the body is not valid JSON: {exc}") from exc
    except RecursionError:
        raise InvalidInput("the body is not valid JSON: it is nested too deep") from None


def limit_body(
    body: RequestBody, input_terminated: bool, read_chunks: Callable[[Optional[int]], int], limit: Optional[int]
) -> None:
    """Hold a request to the body limit ``limit`` (bytes; ``None``: none): a
    body over it is refused (413) at once by its ``Content-Length``; one
    sent in chunks is read whole by ``read_chunks(limit)``, no further than
    one byte past the limit (it returns the bytes read), and refused if it
    goes past, rather than reaching the model cut short. A body in chunks
    the server did not decode (``input_terminated`` false) is a 411."""
    if body.content_length is not None or not body.chunked:
        check_body_size(body.content_length, limit)
        return
    refuse_undecoded_chunks(True, input_terminated)
    check_read_size(read_chunks(limit), limit)


def check_many(many: Any, max_inputs: Any, max_inputs_given: bool, where: str) -> None:
    """Check an endpoint's ``many`` and ``max_inputs`` as declared, naming
    it as ``where`` ("the batched route '/embed'"): ``many`` a bool, and
    ``max_inputs``, where given, only with ``many=True`` and a whole number
    of at least 1. Both layers' routes and views, one wording."""
    if not isinstance(many, bool):
        raise TypeError(f"many of {where} must be True or False, got {many!r}")
    if max_inputs_given:
        if not many:
            raise TypeError(f"max_inputs of {where} goes with many=True")
        OPTIONS["max_inputs"].checked(max_inputs, f"max_inputs of {where}")


def inputs_of(parsed: Any, most: int) -> List[Any]:
    """The inputs of a request to an endpoint that takes many (a list, as
    its parse hook or the default rule made it), at most ``most`` of them:
    :class:`InvalidInput` (400) for anything but a list,
    :class:`PayloadTooLarge` (413) for more, both before anything is queued."""
    if not isinstance(parsed, (list, tuple)):
        raise InvalidInput(f"send a list of inputs (a JSON array), got {type(parsed).__name__}")
    if len(parsed) > most:
        raise PayloadTooLarge(
            f"{len(parsed)} inputs in one request, more than the {most} this endpoint takes: send them in "
            "several requests"
        )
    return list(parsed)


def default_input(
    body: RequestBody,
    field: Optional[str],
    max_bytes: Optional[int],
    loads: Callable[[bytes], Any],
    many: bool = False,
) -> Any:
    """The model input of a request by the default rule: the JSON body (its
    key ``field`` when given), else the form field ``field``, else the
    uploaded file ``field`` as ``bytes`` (at most ``max_bytes``): see
    :func:`~streamer_core.web.http.item_from_request`. A body of another
    media type is a 415. A small multipart body of the common shape is cut
    in C within the framework's limits (:class:`FormLimits`); any other
    goes to the framework's parser. Read only what is needed: a form costs
    even when empty, so JSON is looked at first. ``many``: the inputs of an
    endpoint that takes many: the JSON array (or its key ``field``), else
    every value of the form field ``field``, else every file of it (``curl
    -F "file=@a.jpg" -F "file=@b.jpg"``)."""
    has_body = _has_body(body)
    check_media_type(body.media_type, has_body, forms=body.reads_form and field is not None)
    if is_json_type(body.media_type):
        return item_from_request(json_of(body.data(), loads), None, field)
    if not body.reads_form:
        return item_from_request(MISSING, None, field)
    if many and field is not None:
        fields, files = body.parsed_form()
        values = _every(fields, field)
        if not values:
            values = [read_upload(upload, field, max_bytes) for upload in _every(files, field)]
        if values:
            return values
        _no_boundary(body, fields, files)
        return item_from_request(MISSING, fields, field, files, max_bytes)  # says what to send
    fields, files = _form(body) if body.media_type == "multipart/form-data" else body.parsed_form()
    _no_boundary(body, fields, files)
    return item_from_request(MISSING, fields, field, files, max_bytes)


def upload_of(body: RequestBody, field: str, max_bytes: Optional[int]) -> bytes:
    """The bytes of the file ``field`` of a multipart form, for an endpoint
    that takes a file and nothing else (an image to classify): every answer
    for what is not such an upload says how to send one, rather than the
    default rule's "send JSON", which such an endpoint would then refuse.
    A body of another type is a 415; no body, a text field of that name or
    a form without it a 400; a file over ``max_bytes`` a 413."""
    how = f'send the file as "{field}" of a multipart form: curl -F "{field}=@path"'
    if body.media_type != "multipart/form-data":
        if _has_body(body):
            kind = body.media_type or "a body with no Content-Type"
            raise UnsupportedMediaType(f"{kind} is not read here: {how}")
        raise InvalidInput(f"the request has no file: {how}")
    fields, files = _form(body)
    _no_boundary(body, fields, files)
    if field in files:
        return read_upload(files[field], field, max_bytes)
    if field in fields:
        raise InvalidInput(f'"{field}" was sent as a text field, not a file: {how}')
    raise InvalidInput(f'the form has no file "{field}": {how}')


def _has_body(body: RequestBody) -> bool:
    return (body.content_length or 0) > 0 or body.chunked


def _no_boundary(body: RequestBody, fields: Mapping[str, Any], files: Mapping[str, Any]) -> None:
    """Say why a multipart body came out as no ``fields`` and no ``files``
    where the reason is plain: its Content-Type names no boundary, which
    every parser reads as an empty form. Rather than "send the field",
    which the client thinks it did."""
    if fields or files or body.media_type != "multipart/form-data" or not _has_body(body):
        return
    if not body.boundary():
        raise InvalidInput(
            "the multipart body has no boundary: send Content-Type: multipart/form-data; boundary=... "
            '(curl -F "name=value" does)'
        )


def _form(body: RequestBody) -> Tuple[Mapping[str, Any], Mapping[str, Any]]:
    """A multipart body's fields and files: cut in C when small and of the
    common shape, else by the framework's parser (as :func:`default_input`)."""
    if not body.chunked and (body.content_length or 0) <= READ_WHOLE_BYTES:
        limits = body.form_limits()
        if limits is not None:
            form = parse_form(
                body.data(), body.boundary(), max_parts=limits.max_parts, max_field_bytes=limits.max_field_bytes
            )
            if form is not None:
                return form.fields, form.files
    return body.parsed_form()


def _every(values: Mapping[str, Any], name: str) -> List[Any]:
    """Every value of ``name`` in a form's fields or files (a Flask
    ``MultiDict``, a Django ``QueryDict``: both have ``getlist``)."""
    getlist = getattr(values, "getlist", None)
    if getlist is not None:
        return list(getlist(name))
    return [values[name]] if name in values else []
