"""Django's own view decorators on every form of batched view (a sync and
an async function, a sync and an async class with ``method_decorator``):
``login_required``, ``permission_required``, ``cache_control``,
``csrf_protect`` and ``csrf_exempt`` each do what they do on any view; and a
request whose user Django's session authenticated is CSRF-checked even on a
view exempt from the check, before its body is read or anything queued."""

from __future__ import annotations

import asyncio
import json
from typing import Any, Iterator

import pytest
from django.contrib.auth.models import Permission, User
from django.middleware.csrf import get_token
from django.test import AsyncClient, Client, RequestFactory

from django_streamer import started_models
from tests.django.idiom_views import FORMS
from tests.django.test_json_errors import error_of

# Committed: an ASGI request reads the database from a thread of its own.
pytestmark = pytest.mark.django_db(transaction=True)

SESSIONS = [
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
]


@pytest.fixture(autouse=True)
def _sessions(settings: Any) -> Iterator[None]:
    """Django's sessions and authentication, as a project with users has them."""
    settings.MIDDLEWARE = SESSIONS
    yield


@pytest.fixture
def user() -> User:
    return User.objects.create_user("ada", password="not-used")


@pytest.fixture(params=["wsgi", "asgi"])
def make_client(request: Any) -> Any:
    """Django's test client by WSGI's path or ASGI's (where an async view
    runs on the event loop), ``enforce_csrf_checks`` as given."""
    return AsyncClient if request.param == "asgi" else Client


def post(client: Any, url: str, data: Any = None, token: str = "", body: str = "") -> Any:
    headers = {"X-CSRFToken": token} if token else {}
    response = client.post(url, body or json.dumps(data), content_type="application/json", headers=headers)
    return asyncio.run(response) if isinstance(client, AsyncClient) else response


def with_token(client: Any) -> str:
    """A CSRF token for ``client``: the cookie set, the value to send back."""
    token = get_token(RequestFactory().get("/"))
    client.cookies["csrftoken"] = token
    return token


@pytest.mark.parametrize("form", FORMS)
def test_login_required_sends_an_anonymous_request_to_log_in_and_serves_a_logged_in_one(form, user, make_client):
    client = make_client()
    response = post(client, f"/idioms/login_required/{form}", {"x": 21})
    assert response.status_code == 302 and response["Location"].startswith("/accounts/login/?next="), response
    assert started_models() == [], "the refused request reached the model"
    client.force_login(user)
    response = post(client, f"/idioms/login_required/{form}", {"x": 21})
    assert response.status_code == 200 and response.json() == 42, response.content


@pytest.mark.parametrize("form", FORMS)
def test_permission_required_refuses_a_user_without_the_permission(form, user, make_client):
    client = make_client()
    client.force_login(user)
    assert post(client, f"/idioms/permission_required/{form}", {"x": 1}).status_code == 403
    assert started_models() == []
    user.user_permissions.add(Permission.objects.get(codename="add_user"))
    client.force_login(User.objects.get(pk=user.pk))  # permissions are cached on the user object
    response = post(client, f"/idioms/permission_required/{form}", {"x": 2})
    assert response.status_code == 200 and response.json() == 4, response.content


@pytest.mark.parametrize("form", FORMS)
def test_cache_control_marks_the_answer(form, make_client):
    response = post(make_client(), f"/idioms/cache_control/{form}", {"x": 3})
    assert response.status_code == 200 and response.json() == 6, response.content
    assert set(response["Cache-Control"].split(", ")) == {"max-age=60", "private"}


@pytest.mark.parametrize("form", FORMS)
def test_csrf_protect_checks_a_view_exempt_by_default(form, make_client):
    client = make_client(enforce_csrf_checks=True)
    assert post(client, f"/idioms/none/{form}", {"x": 1}).status_code == 200, "exempt without the decorator"
    response = post(client, f"/idioms/csrf_protect/{form}", {"x": 1})
    assert response.status_code == 403, response.content
    if form in ("sync", "async"):
        assert error_of(response, 403)["type"] == "CsrfFailure"
    response = post(client, f"/idioms/csrf_protect/{form}", {"x": 2}, token=with_token(client))
    assert response.status_code == 200 and response.json() == 4, response.content


@pytest.mark.parametrize("form", FORMS)
def test_csrf_exempt_exempts_a_view_made_to_check(form, make_client):
    client = make_client(enforce_csrf_checks=True)
    response = post(client, f"/idioms/csrf_exempt/{form}", {"x": 5})
    assert response.status_code == 200 and response.json() == 10, response.content


def test_of_csrf_exempt_and_csrf_protect_on_one_view_the_one_nearest_it_decides(make_client):
    client = make_client(enforce_csrf_checks=True)
    assert error_of(post(client, "/idioms/exempt-over-protect", {"x": 1}), 403)["type"] == "CsrfFailure"
    response = post(client, "/idioms/protect-over-exempt", {"x": 1})
    assert response.status_code == 200 and response.json() == 2, response.content


def test_csrf_exempt_and_csrf_protect_on_as_view_decide_as_on_a_function(make_client):
    client = make_client(enforce_csrf_checks=True)
    assert error_of(post(client, "/idioms/protect-as-view", {"x": 1}), 403)["type"] == "CsrfFailure"
    response = post(client, "/idioms/exempt-as-view", {"x": 1})
    assert response.status_code == 200 and response.json() == 2, response.content


@pytest.mark.parametrize("decorator", ["none", "csrf_exempt", "login_required"])
@pytest.mark.parametrize("form", FORMS)
def test_a_logged_in_session_is_csrf_checked_on_an_exempt_view(form, decorator, user, make_client):
    """The session cookie rides on a cross-site request: without a token, a
    JSON 403 before the body is read (this one is not JSON) or anything
    queued; with the token, served."""
    client = make_client(enforce_csrf_checks=True)
    client.force_login(user)
    url = f"/idioms/{decorator}/{form}"
    error = error_of(post(client, url, body="{not json"), 403)
    assert error["type"] == "CsrfFailure" and "CSRF" in error["message"], error
    assert started_models() == [], "the refused request reached the model"
    response = post(client, url, {"x": 7}, token=with_token(client))
    assert response.status_code == 200 and response.json() == 14, response.content


@pytest.mark.parametrize("form", FORMS)
def test_requests_without_a_logged_in_session_stay_exempt(form, user, make_client):
    """An anonymous request, and one whose session names no user (it was
    logged out), need no token: they carry no one's authority."""
    client = make_client(enforce_csrf_checks=True)
    assert post(client, f"/idioms/none/{form}", {"x": 4}).json() == 8
    client.force_login(user)
    client.logout()
    client.cookies["sessionid"] = "a-session-that-names-no-one"
    response = post(client, f"/idioms/none/{form}", {"x": 4})
    assert response.status_code == 200 and response.json() == 8, response.content


@pytest.mark.parametrize("url", ["/idioms/ensure-cookie", "/idioms/requires-token"])
def test_djangos_other_csrf_decorators_are_not_taken_for_csrf_protect(url: str) -> None:
    """``ensure_csrf_cookie`` and ``requires_csrf_token`` refuse nothing: a
    request with no session and no token is served, as on any view."""
    response = post(Client(enforce_csrf_checks=True), url, {"x": 4})
    assert response.status_code == 200 and response.json() == 8, response.content


def test_a_user_a_middleware_authenticated_without_the_session_stays_exempt(settings: Any) -> None:
    """An API key is no cookie a browser sends on its own: a request whose
    user a middleware of the project's own logged in, with no session
    cookie, needs no token on an exempt view."""
    settings.MIDDLEWARE = [*SESSIONS, "tests.django.idiom_views.KeyUser"]
    client = Client(enforce_csrf_checks=True)
    response = client.post(
        "/idioms/none/sync",
        json.dumps({"x": 4}),
        content_type="application/json",
        headers={"Authorization": "Key secret"},
    )
    assert response.status_code == 200 and response.json() == 8, response.content


def test_a_class_views_async_post_of_its_own_keeps_the_views_refusals(user: Any) -> None:
    """A sync class view whose subclass made ``post`` async is served as an
    async view: another method is still the project's JSON 405, and a
    session's request without a token its JSON 403."""
    client = AsyncClient(enforce_csrf_checks=True)
    refused = asyncio.run(client.get("/idioms/async-post"))
    assert refused.status_code == 405 and error_of(refused, 405)["type"] == "MethodNotAllowed", refused.content
    assert (
        asyncio.run(client.post("/idioms/async-post", json.dumps({"x": 4}), content_type="application/json")).json()
        == 8
    )
    client.force_login(user)
    forged = post(client, "/idioms/async-post", {"x": 4})
    assert forged.status_code == 403 and error_of(forged, 403)["type"] == "CsrfFailure", forged.content
