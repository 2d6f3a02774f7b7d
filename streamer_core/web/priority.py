"""A batched endpoint's priority level: from the route (an option), or from
a request header the route allows.

A Flask route (``@batched_route(..., priority=1, priority_header=True)``)
and a Django view (``@batched_view("embed", priority=1,
priority_header=True)``, ``BatchedView.as_view(priority=...)``) declare it;
both make an :class:`EndpointPriority`, checked as it is declared, and
checked again against the model's ``priority_levels`` as soon as those are
known (Flask: ``init_app`` or the route's declaration, whichever comes
last; Django: the system check ``django_streamer.E011``).

For each request (:meth:`EndpointPriority.level`):

- where the route allows the header (``priority_header=True``:
  :data:`PRIORITY_HEADER`, or the header named) and the request carries
  it, its value is the level: a whole number from 1 (the highest) to
  ``priority_levels``, else a 400 saying the allowed range, before
  anything is queued;
- otherwise the route's ``priority``, or, where it gives none, the model's
  ``default_priority`` (the lowest level when that is unset).

A route that does not allow the header ignores it: a caller of a public
route cannot jump the queue by sending it. Allow it only on a route whose
callers may choose their level (an internal one, or one behind a proxy
that sets or strips the header).
"""

from __future__ import annotations

import re
from typing import Any, NamedTuple, Optional

from ..errors import InvalidInput
from ..options.config import BatchingConfig

__all__ = ["PRIORITY_HEADER", "EndpointPriority"]

#: The request header a route with ``priority_header=True`` reads the level from.
PRIORITY_HEADER = "X-Priority"
# An HTTP header name (RFC 9110's token).
_HEADER_NAME = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+\Z")
# A header value read as a level: a few ASCII digits, spaces around them allowed.
_LEVEL = re.compile(r"[0-9]{1,9}\Z")


class EndpointPriority(NamedTuple):
    """The priority of one endpoint's requests: ``route_level``, its own
    level (``None``: the model's default), and ``header``, the request
    header it lets callers choose one by (``None``: none)."""

    route_level: Optional[int] = None
    header: Optional[str] = None

    @classmethod
    def checked(cls, priority: Any, priority_header: Any, where: str) -> EndpointPriority:
        """The priority of the endpoint declared as ``where`` ("the batched
        route '/embed'") with the options ``priority`` (``None`` or a whole
        number >= 1) and ``priority_header`` (``False``, ``True`` for
        :data:`PRIORITY_HEADER`, or a header's name); raises ``TypeError`` or
        ``ValueError`` saying what to write."""
        if priority is not None and (isinstance(priority, bool) or not isinstance(priority, int) or priority < 1):
            kind = ValueError if isinstance(priority, int) and not isinstance(priority, bool) else TypeError
            raise kind(
                f"priority of {where} must be a whole number >= 1 (1 the highest level) or None for the model's "
                f"default_priority, got {priority!r}"
            )
        if priority_header is False or priority_header is None:
            header = None
        elif priority_header is True:
            header = PRIORITY_HEADER
        elif isinstance(priority_header, str) and _HEADER_NAME.match(priority_header):
            header = priority_header
        else:
            raise TypeError(
                f"priority_header of {where} must be True (the {PRIORITY_HEADER} header), False, or the name of a "
                f"request header such as 'X-Request-Priority', got {priority_header!r}"
            )
        return cls(priority, header)

    @property
    def given(self) -> bool:
        """Whether the endpoint says anything of its requests' level."""
        return self.route_level is not None or self.header is not None

    def problem(self, levels: int, where: str, levels_name: str) -> Optional[str]:
        """What is wrong with this priority for a model of ``levels``
        priority levels (``levels_name``: the setting, as the user wrote
        it), or ``None``."""
        if self.route_level is not None and self.route_level > levels:
            return (
                f"priority of {where} is {self.route_level}, but its model has {levels} priority level"
                f"{'s' if levels > 1 else ''} ({levels_name} is {levels}): give a level from 1 (the highest) to "
                f"{levels}, or raise {levels_name}"
            )
        if self.header is not None and levels == 1:
            return (
                f"priority_header of {where} lets requests choose their level by the {self.header} header, but its "
                f"model has one level ({levels_name} is 1): set {levels_name} to 2 or more, or drop priority_header"
            )
        return None

    def level(self, header_value: Optional[str], config: BatchingConfig) -> Optional[int]:
        """The level of a request whose :attr:`header` is ``header_value``
        (``None``: it carries none), for a model of ``config``: ``None``
        for the model's default. Raises :class:`InvalidInput` (400) for a
        header value that is not one of the model's levels."""
        if self.header is not None and header_value is not None:
            levels = config.priority_levels
            text = header_value.strip()
            if _LEVEL.match(text) and 1 <= int(text) <= levels:
                return int(text)
            shown = header_value if len(header_value) <= 20 else header_value[:20] + "..."
            raise InvalidInput(
                f"the {self.header} header must be a whole number from 1 (the highest priority) to {levels}, "
                f"got {shown!r}"
            )
        return self.route_level
