"""A fast path for the multipart forms that clients actually send.

An upload to a batched route (``curl -F "file=@cat.jpg"``, a browser's
form, ``requests``' ``files=``) is a ``multipart/form-data`` body of a few
parts, each with a ``Content-Disposition`` and perhaps a ``Content-Type``,
lines ended by CRLF. werkzeug's and Django's parsers read any body a client
may send, as a stream, in a Python state machine; on a 35 KB JPEG that was
a quarter of the web process's CPU per upload (werkzeug searches the part's
data with a regular expression that is tried at every byte). Here a body
already in memory is cut at its boundaries with ``bytes.find``, which runs
at memory speed, and the part headers are read by a strict pattern.

Anything out of the common shape (a preamble with text in it, bare LF line
ends, a header other than those two, a quoted name with escapes, an RFC 2231
``filename*``, a text field that is not UTF-8, too many parts, a text field
over the limit) is *not* read here: :func:`parse_form` returns ``None`` and the
framework's own parser reads the body, so that its rules and its errors
apply as before. The fast path only ever answers what that parser would.
"""

from __future__ import annotations

import re
from typing import Dict, NamedTuple, Optional, Tuple

__all__ = ["Form", "parse_form"]


class Form(NamedTuple):
    """A parsed form: its text fields and its files (by field name, the
    first part of each name, as ``MultiDict[name]`` answers)."""

    fields: Dict[str, str]
    files: Dict[str, bytes]


# form-data; name="..." [; filename="..."], the shape every client sends
# (browsers percent-encode a quote or a line break in a name).
_DISPOSITION = re.compile(rb'form-data; ?name="([^"\\\r\n]*)"(?:; ?filename="([^"\\\r\n]*)")?\Z', re.IGNORECASE)
_CRLF = b"\r\n"


def parse_form(
    body: bytes,
    boundary: str,
    *,
    max_parts: Optional[int] = None,
    max_field_bytes: Optional[int] = None,
) -> Optional[Form]:
    """The fields and files of ``body``, a whole ``multipart/form-data``
    body cut by ``boundary`` (the ``boundary`` parameter of its
    ``Content-Type``), or ``None`` when the body is not of the common shape
    (then let the framework's parser read it: it reads every shape and says
    what is wrong with a malformed one).

    ``max_parts`` and ``max_field_bytes`` are the framework's limits on the
    number of parts and on one text field's size: past them this returns
    ``None`` too, so the framework refuses the body as it always has."""
    if not boundary or len(boundary) > 200:
        return None
    try:
        delimiter = b"--" + boundary.encode("ascii")
    except UnicodeEncodeError:
        return None
    # An empty preamble may come before the first delimiter, as its CRLF.
    position = 2 if body.startswith(_CRLF) else 0
    if not body.startswith(delimiter + _CRLF, position):
        return None
    separator = _CRLF + delimiter
    fields: Dict[str, str] = {}
    files: Dict[str, bytes] = {}
    position += len(delimiter) + 2
    parts = 0
    while True:
        parts += 1
        if max_parts is not None and parts > max_parts:
            return None
        headers_end = body.find(_CRLF + _CRLF, position)
        if headers_end < 0:
            return None
        part = _read_headers(body[position:headers_end])
        if part is None:
            return None
        name, filename = part
        # An empty part may share the blank line's CRLF with the delimiter
        # (werkzeug's encoder writes it so): search from that CRLF.
        data_end = body.find(separator, headers_end + 2)
        if data_end < 0:
            return None
        data = body[headers_end + 4 : data_end]
        if filename is None:
            if max_field_bytes is not None and len(data) > max_field_bytes:
                return None
            try:
                text = data.decode("utf-8")
            except UnicodeDecodeError:
                return None
            fields.setdefault(name, text)
        else:
            files.setdefault(name, data)
        position = data_end + len(separator)
        after = body[position : position + 2]
        if after == b"--":  # the close delimiter; an epilogue may follow a CRLF
            rest = body[position + 2 :]
            if rest and not rest.startswith(_CRLF):
                return None
            return Form(fields, files)
        if after != _CRLF:
            return None
        position += 2


def _read_headers(block: bytes) -> Optional[Tuple[str, Optional[str]]]:
    """A part's field name and file name (``None`` for a text field), from
    its header lines; ``None`` when they are not the common shape."""
    disposition = None
    for line in block.split(_CRLF):
        name, colon, value = line.partition(b":")
        if not colon:
            return None
        key = name.strip().lower()
        if key == b"content-disposition" and disposition is None:
            disposition = _DISPOSITION.match(value.strip())
            if disposition is None:
                return None
        elif key != b"content-type":
            return None  # Content-Transfer-Encoding and the like: the framework's parser
    if disposition is None:
        return None
    try:
        field = disposition.group(1).decode("utf-8")
        filename = disposition.group(2)
        return field, None if filename is None else filename.decode("utf-8")
    except UnicodeDecodeError:
        return None
