"""The response a batched route answers with by default: Flask's own, handed
to the WSGI server without werkzeug's general handling where none of it
applies."""

from __future__ import annotations

from typing import Any, Iterable, List, Tuple

from flask import Response

__all__ = ["JsonAnswer"]

# Headers werkzeug rewrites as a response is sent (made absolute URLs).
_REWRITTEN = frozenset({"location", "content-location"})


class JsonAnswer(Response):
    """Flask's :class:`~flask.Response`, made by a batched route for its JSON
    answer, and seen as such by the app's ``after_request`` hooks.

    Called as a WSGI application (as Flask calls a view's response), werkzeug
    copies its headers, looks for a ``Location`` to make absolute, works out
    what the status and the request's method allow, and wraps the body in
    an iterator that closes it: a share of every request's CPU worth
    saving (the docs' Performance page). An answer as the route makes it needs
    none of that: a 200 to a request other than ``HEAD``, its body one
    ``bytes`` held in a list, no ``Location`` or ``Content-Location``,
    nothing to call as it closes. Such an answer goes to the server as it
    is, with the same status, headers and bytes werkzeug would send; one
    that a hook changed into anything else is sent by werkzeug."""

    def __call__(self, environ: Any, start_response: Any) -> Iterable[bytes]:
        body = self.response
        if (
            self.status_code == 200
            and type(body) is list
            and len(body) == 1
            and type(body[0]) is bytes
            and not getattr(self, "_on_close", True)  # werkzeug's close callbacks (none: a later werkzeug's)
            and environ.get("REQUEST_METHOD") != "HEAD"
        ):
            headers: List[Tuple[str, str]] = self.headers.to_wsgi_list()
            length = False
            for key, _ in headers:
                lowered = key.lower()
                if lowered in _REWRITTEN:
                    return super().__call__(environ, start_response)
                length = length or lowered == "content-length"
            if not length and self.automatically_set_content_length:
                headers.append(("Content-Length", str(len(body[0]))))
            start_response(self.status, headers)
            return body
        return super().__call__(environ, start_response)
