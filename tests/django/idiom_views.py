"""The test project's batched views under Django's own view decorators: each
decorator on each form of batched view, a sync and an async function
(decorated as any view is) and a sync and an async class (the decorator on
``dispatch`` by ``method_decorator``), served at ``idioms/<decorator>/<form>``.
Every view doubles the input "x" (the model "double")."""

from __future__ import annotations

from typing import Any, Callable, Dict, List

from django.contrib.auth.decorators import login_required, permission_required
from django.http import HttpRequest
from django.urls import URLPattern, path
from django.utils.decorators import method_decorator
from django.views.decorators.cache import cache_control
from django.views.decorators.csrf import csrf_exempt, csrf_protect, ensure_csrf_cookie, requires_csrf_token

from django_streamer import AsyncBatchedView, BatchedView, batched_view, request_item

FORMS = ("sync", "async", "class", "aclass")

#: The decorators, by name; "csrf_exempt" decorates views made with csrf_exempt=False.
DECORATORS: Dict[str, Callable[..., Any]] = {
    "login_required": login_required,
    "permission_required": permission_required("auth.add_user", raise_exception=True),
    "cache_control": cache_control(max_age=60, private=True),
    "csrf_protect": csrf_protect,
    "csrf_exempt": csrf_exempt,
    "none": lambda view: view,
}


def parse(request: HttpRequest) -> Any:
    return request_item(request, "x")


async def aparse(request: HttpRequest) -> Any:
    return request_item(request, "x")


def forms(decorator: Callable[..., Any], exempt: bool) -> Dict[str, Callable[..., Any]]:
    """The four forms of a batched view of "double" under ``decorator``."""
    views = {}
    views["sync"] = decorator(batched_view("double", csrf_exempt=exempt)(parse))
    views["async"] = decorator(batched_view("double", csrf_exempt=exempt)(aparse))
    for form, base in (("class", BatchedView), ("aclass", AsyncBatchedView)):
        cls = type(f"Decorated{base.__name__}", (base,), {"model": "double", "field": "x", "csrf_exempt": exempt})
        views[form] = method_decorator(decorator, name="dispatch")(cls).as_view()
    return views


urlpatterns: List[URLPattern] = [
    path(f"{name}/{form}", view)
    for name, decorator in DECORATORS.items()
    for form, view in forms(decorator, exempt=name != "csrf_exempt").items()
]
# Both decorators on one view: the one nearest the view decides, as on any Django view.
urlpatterns += [
    path("exempt-over-protect", csrf_exempt(csrf_protect(batched_view("double")(parse)))),
    path("protect-over-exempt", csrf_protect(csrf_exempt(batched_view("double", csrf_exempt=False)(parse)))),
]
# On as_view(), as on a function.
urlpatterns += [
    path("protect-as-view", csrf_protect(AsyncBatchedView.as_view(model="double", field="x"))),
    path("exempt-as-view", csrf_exempt(BatchedView.as_view(model="double", field="x", csrf_exempt=False))),
]
# Django's other CSRF decorators, which refuse nothing: not taken for csrf_protect.
urlpatterns += [
    path("ensure-cookie", ensure_csrf_cookie(batched_view("double")(parse))),
    path("requires-token", requires_csrf_token(batched_view("double")(parse))),
]


class AsyncPost(BatchedView):
    """A sync class view whose subclass made its ``post`` async: Django
    serves it as an async view, the refusals included."""

    model = "double"
    field = "x"

    async def post(self, request: HttpRequest, *args: Any, **kwargs: Any) -> Any:  # type: ignore[override]
        return await AsyncBatchedView.post(self, request, *args, **kwargs)  # type: ignore[arg-type]


urlpatterns += [path("async-post", AsyncPost.as_view())]


class KeyUser:
    """A middleware of a project's own that authenticates by an API key
    (``Authorization: Key secret``), not by the session: its user is
    logged in, and no session cookie comes with the request."""

    def __init__(self, get_response: Callable[[HttpRequest], Any]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> Any:
        if request.META.get("HTTP_AUTHORIZATION") == "Key secret":
            from django.contrib.auth.models import User

            request.user = User(username="program", is_active=True)
        return self.get_response(request)
