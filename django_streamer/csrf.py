"""Cross-site request forgery and the batched views.

A batched view is exempt from Django's CSRF check by default: it is an API
for programs, which send no cookies. A browser sends its cookies on a
cross-site request too, so a request whose user Django's session
authenticated (the session cookie sent, ``SessionMiddleware`` and
``AuthenticationMiddleware`` giving an authenticated ``request.user``) is
checked even on an exempt view, as Django REST framework's
``SessionAuthentication`` checks it: without a valid token it is a JSON 403,
before the view parses its body or queues anything. A request with no session's
user (an API token a middleware read, an anonymous one) stays exempt.

Django's ``csrf_exempt`` and ``csrf_protect`` on a batched function view (or
on ``as_view()``) override its ``csrf_exempt`` option, the one nearest the
view first; on a class's ``dispatch`` (``method_decorator``),
``csrf_protect`` is Django's own check and ``csrf_exempt`` exempts the view.
The batched view's own mark, ``csrf_exempt = True`` (so that Django's
middleware leaves the check to the view, which answers it as JSON), is
copied by ``functools.wraps`` onto every decorator's wrapper, so Django's
own decorators would see every batched view as exempt: the view finds them
among the wrappers of the view it was reached by (:func:`exempt_for`).
"""

from __future__ import annotations

from typing import Any, List, Optional

from asgiref.sync import sync_to_async
from django.conf import settings
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.middleware.csrf import CsrfViewMiddleware
from django.views.decorators.csrf import csrf_exempt, csrf_protect

from streamer_core.web.http import error_body

__all__ = ["JsonCsrfCheck", "exempt_for", "refusal", "arefusal", "session_user", "asession_user"]

#: The attribute every batched view carries (its model's name), which
#: ``functools.wraps`` copies onto each wrapper around it.
_MARK = "streamer_model"


class JsonCsrfCheck(CsrfViewMiddleware):
    """Django's CSRF check, answering a failure with the project's JSON 403
    rather than Django's HTML page."""

    def _reject(self, request: HttpRequest, reason: str) -> HttpResponse:
        return JsonResponse(error_body(403, "CsrfFailure", f"CSRF verification failed: {reason}"), status=403)


def _check(request: HttpRequest) -> Optional[HttpResponse]:
    """Django's CSRF check of ``request``: a JSON 403, or ``None`` when it passes."""
    check = JsonCsrfCheck(lambda _request: HttpResponse())
    if "CSRF_COOKIE" not in request.META:  # the middleware is not installed: read the cookie here
        check.process_request(request)
    rejection: Optional[HttpResponse] = check.process_view(request, None, (), {})  # type: ignore[arg-type]
    return rejection


def session_user(request: HttpRequest) -> bool:
    """Whether ``request`` carries a user that Django's session
    authenticated: the session cookie sent, and ``request.user`` logged in."""
    if not hasattr(request, "session") or settings.SESSION_COOKIE_NAME not in request.COOKIES:
        return False
    user = getattr(request, "user", None)
    return bool(user is not None and user.is_authenticated)


async def asession_user(request: HttpRequest) -> bool:
    """:func:`session_user` in async code: the user by ``await
    request.auser()``, as reading the lazy ``request.user`` there would query
    the database on the event loop."""
    if not hasattr(request, "session") or settings.SESSION_COOKIE_NAME not in request.COOKIES:
        return False
    auser = getattr(request, "auser", None)
    if auser is None:  # a middleware of the project's own set request.user
        return bool(await sync_to_async(session_user)(request))
    user = await auser()
    return bool(user.is_authenticated)


def refusal(request: HttpRequest, exempt: bool) -> Optional[HttpResponse]:
    """The JSON 403 of a request that fails the CSRF check it needs (every
    request to a view that is not ``exempt``; to one that is, a request of
    a session's user), or ``None``."""
    if exempt and not session_user(request):
        return None
    return _check(request)


async def arefusal(request: HttpRequest, exempt: bool) -> Optional[HttpResponse]:
    """:func:`refusal` for an async view. The check runs on a thread, as
    Django runs its middleware's under ASGI: with ``CSRF_USE_SESSIONS`` it
    reads the session."""
    if exempt and not await asession_user(request):
        return None
    rejection: Optional[HttpResponse] = await sync_to_async(_check)(request)
    return rejection


def exempt_for(request: HttpRequest, exempt: bool) -> bool:
    """Whether the batched view ``request`` reached is exempt: as Django's
    ``csrf_exempt`` or ``csrf_protect`` nearest the view says, among the
    wrappers of the view the URLconf gave (``request.resolver_match``);
    where there is neither, its own option ``exempt``."""
    match = getattr(request, "resolver_match", None)
    wrapper = match.func if match is not None else None
    decided: Optional[bool] = None
    while wrapper is not None and hasattr(wrapper, _MARK):  # a wrapper of a batched view, or the view
        said = _django_decorator(wrapper)
        if said is not None:
            decided = said  # inner wrappers come later: the nearest the view is the last found
        wrapper = getattr(wrapper, "__wrapped__", None)
    return exempt if decided is None else decided


# -- Django's decorators, known by their wrappers ---------------------------------
#
# csrf_exempt and csrf_protect leave no attribute of their own on the view
# they wrap (wraps() copies the batched view's csrf_exempt over theirs), so
# their wrappers are known by their code: one code object per decorator for
# every view it wraps, read here from Django's own decorators applied to two
# sample views. csrf_protect's wrapper is the wrapper of any decorator made
# from a middleware (cache_page's too): it is csrf_protect's when the
# middleware it holds is CsrfViewMiddleware itself (requires_csrf_token and
# ensure_csrf_cookie hold subclasses that refuse nothing).


def _sample(request: HttpRequest) -> HttpResponse:  # pragma: no cover - never called
    return HttpResponse()


async def _asample(request: HttpRequest) -> HttpResponse:  # pragma: no cover - never called
    return HttpResponse()


_EXEMPT_CODES = frozenset(csrf_exempt(view).__code__ for view in (_sample, _asample))
_MIDDLEWARE_CODES = frozenset(csrf_protect(view).__code__ for view in (_sample, _asample))


def _django_decorator(wrapper: Any) -> Optional[bool]:
    """``True`` where Django's ``csrf_exempt`` made ``wrapper``, ``False``
    where its ``csrf_protect`` did, else ``None``."""
    code = getattr(wrapper, "__code__", None)
    if code in _EXEMPT_CODES:
        return True
    if code in _MIDDLEWARE_CODES and any(type(held) is CsrfViewMiddleware for held in _held(wrapper, 2)):
        return False
    return None


def _held(function: Any, depth: int) -> List[Any]:
    """What ``function``'s closure holds, and their closures', ``depth`` deep."""
    found = []
    for cell in getattr(function, "__closure__", None) or ():
        try:
            value = cell.cell_contents
        except ValueError:  # an empty cell
            continue
        found.append(value)
        if depth > 1 and callable(value):
            found.extend(_held(value, depth - 1))
    return found
