"""The batched view as a Django REST framework view (django_streamer.rest),
through DRF's test client and under gunicorn: authentication, permission
and throttle classes refuse a request before anything is queued, DRF's
parsers read the body, and every error is answered in DRF's shape
(``{"detail": ...}`` or field errors), the streamer's with the project's
statuses."""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request
from typing import Any, Dict, Iterator, List, Tuple

import pytest
from django.contrib.auth.models import User
from django.core.cache import cache
from django.middleware.csrf import get_token
from django.test import RequestFactory
from rest_framework.test import APIClient

from django_streamer import started_models
from streamer_core.telemetry.stats import stats_for
from tests.django.test_idioms import SESSIONS
from tests.helpers import failure_behind

KEY = {"HTTP_AUTHORIZATION": "Key secret"}


@pytest.fixture(autouse=True)
def _fresh_throttles() -> Iterator[None]:
    cache.clear()  # DRF's throttles count in Django's cache
    yield
    cache.clear()


def post(url: str, data: Any = None, client: Any = None, **extra: Any) -> Any:
    return (client or APIClient()).post(url, data, format="json", **extra)


def calls(model: str = "double") -> Dict[str, int]:
    """The model's calls in this process so far, by outcome."""
    return dict(stats_for(model).snapshot().requests)


def since(before: Dict[str, int], model: str = "double") -> Dict[str, int]:
    """The model's calls since ``before``, by outcome, those of none left out."""
    now = calls(model)
    return {outcome: now[outcome] - before[outcome] for outcome in now if now[outcome] != before[outcome]}


def test_authentication_and_permission_refuse_before_anything_is_queued():
    before = calls()
    response = post("/rest/double", {"x": 21})
    assert response.status_code == 401 and response["WWW-Authenticate"] == "Key", response.content
    assert response.json() == {"detail": "Authentication credentials were not provided."}
    response = post("/rest/double", {"x": 21}, HTTP_AUTHORIZATION="Key wrong")
    assert response.status_code == 401 and response.json() == {"detail": "unknown key"}
    response = post("/rest/staff", {"x": 21}, **KEY)
    assert response.status_code == 403, response.content
    assert response.json() == {"detail": "You do not have permission to perform this action."}
    assert started_models() == [] and since(before) == {}, "a refused request reached the model"
    response = post("/rest/double", {"x": 21}, **KEY)
    assert response.status_code == 200 and response.json() == 42, response.content


def test_a_throttled_request_is_429_with_retry_after_and_not_queued():
    before = calls()
    answers = [post("/rest/throttled", {"x": n}, HTTP_X_CALLER="t1", **KEY) for n in range(4)]
    assert [a.status_code for a in answers] == [200, 200, 200, 429], [a.content for a in answers]
    assert [a.json() for a in answers[:3]] == [0, 2, 4]
    refused = answers[3]
    assert 0 < int(refused["Retry-After"]) <= 60 and "throttled" in refused.json()["detail"], refused.content
    assert since(before) == {"ok": 3}, "the throttled request reached the model"
    assert post("/rest/throttled", {"x": 5}, HTTP_X_CALLER="t2", **KEY).json() == 10, "another caller's own count"


def test_drf_parses_the_body_and_answers_its_errors_in_its_shapes():
    client = APIClient()
    response = client.post("/rest/open", "{nope", content_type="application/json")
    assert response.status_code == 400 and response.json()["detail"].startswith("JSON parse error"), response.content
    response = client.post("/rest/open", "<x>1</x>", content_type="application/xml")
    assert response.status_code == 415, response.content
    assert response.json() == {"detail": 'Unsupported media type "application/xml" in request.'}
    response = post("/rest/open", {"y": 1})
    assert response.status_code == 400 and response.json() == {"x": ["This field is required."]}
    response = post("/rest/open", [1])
    assert response.status_code == 400, response.content
    assert response.json() == {"non_field_errors": ['send an object with the key "x", not a list']}
    response = client.post("/rest/whole", "", content_type="application/json")
    assert response.status_code == 400 and "send the input" in response.json()["detail"], response.content
    response = client.get("/rest/open")
    assert response.status_code == 405 and response.json() == {"detail": 'Method "GET" not allowed.'}
    assert "POST" in response["Allow"]
    assert started_models() == []
    assert client.post("/rest/open", {"x": "ab"}).json() == "abab", "a form, by DRF's FormParser"
    assert post("/rest/whole", 4).json() == 8, "the whole body, without a field"


def test_a_serializers_field_errors_are_a_400_in_drfs_shape():
    before = calls()
    response = post("/rest/validated", {"s": "far too long a sentence"})
    assert response.status_code == 400, response.content
    assert response.json() == {"s": ["Ensure this field has no more than 8 characters."]}
    assert started_models() == []
    assert post("/rest/validated", {"s": "ab"}).json() == "abab"
    assert since(before) == {"invalid": 1, "ok": 1}, "the refused call is counted, once"


def test_the_streamers_failures_keep_the_projects_statuses(streamer_settings, caplog):
    response = post("/rest/open", {"x": "boom"})
    assert response.status_code == 500 and set(response.json()) == {"detail", "id"}, response.content
    answer = response.json()
    failure = failure_behind(
        {"status": 500, "type": "internal_error", "message": answer["detail"], **answer}, caplog.records
    )
    assert str(failure) == "the model refuses 'boom'"
    streamer_settings(
        {
            "double": {"MODEL": "tests.django.batch_models.BrokenModel"},
            "sizes": {"MODEL": "tests.django.batch_models.slow", "TIMEOUT": 0.2},
        }
    )
    response = post("/rest/open", {"x": 1})
    assert response.status_code == 503 and response["Retry-After"] == "5", response.content
    assert "the weights are missing" in response.json()["detail"]
    response = post("/rest/sizes", 1)
    assert response.status_code == 504 and set(response.json()) == {"detail"}, response.content


def test_an_exception_handler_of_the_projects_reads_the_error_type_as_the_code(settings, streamer_settings):
    settings.REST_FRAMEWORK = {"EXCEPTION_HANDLER": "tests.django.rest_views.coded"}
    streamer_settings({"double": {"MODEL": "tests.django.batch_models.BrokenModel"}})
    response = post("/rest/open", {"x": 1})
    assert response.status_code == 503 and response.json()["code"] == "WorkerStartError", response.content


def test_a_body_over_max_body_bytes_is_a_413_before_drf_reads_it(streamer_settings):
    streamer_settings(MAX_BODY_BYTES=100)
    response = post("/rest/open", {"x": "y" * 200})
    assert response.status_code == 413 and "100" in response.json()["detail"], response.content
    assert post("/rest/open", {"x": "y"}).json() == "yy"


def test_many_inputs_outputs_in_order_and_arrays_as_lists():
    assert post("/rest/many", [1, 2, 3]).json() == [2, 4, 6]
    response = post("/rest/many", [1, 2, 3, 4])
    assert response.status_code == 413 and "3" in response.json()["detail"], response.content
    assert APIClient().post("/rest/many-x", {"x": ["a", "b"]}).json() == ["aa", "bb"], "each value of a form field"
    assert post("/rest/many-x", {"x": [1, 2]}).json() == [2, 4], "the key of a JSON object"
    vector = post("/rest/vectors", {"n": 3}).json()
    assert len(vector) == 3 and abs(vector[0] - 0.1 / 3) < 1e-6, vector


def test_an_uploaded_file_reaches_the_model_as_bytes():
    from django.core.files.uploadedfile import SimpleUploadedFile

    upload = SimpleUploadedFile("cat.bin", b"\x00\x01meow")
    answer = APIClient().post("/rest/upload", {"file": upload}, format="multipart").json()
    assert answer == {"type": "bytes", "length": 6, "head": "00016d656f77"}


def test_a_priority_header_out_of_range_is_a_400():
    response = post("/rest/ranked", 1, HTTP_X_PRIORITY="9")
    assert response.status_code == 400 and "X-Priority" in response.json()["detail"], response.content
    assert started_models() == []


def test_the_view_is_checked_as_it_is_declared():
    from django_streamer.rest import BatchedAPIView

    with pytest.raises(TypeError, match="name the model"):
        BatchedAPIView.as_view()
    with pytest.raises(ValueError, match="max_inputs"):
        BatchedAPIView.as_view(model="double", many=True, max_inputs=0)


@pytest.mark.django_db
def test_drfs_session_authentication_checks_csrf(settings):
    """DRF's own rule, which the batched views of django_streamer follow too."""
    settings.MIDDLEWARE = SESSIONS
    client = APIClient(enforce_csrf_checks=True)
    client.force_login(User.objects.create_user("ada", password="not-used"))
    response = post("/rest/session", {"x": 1}, client=client)
    assert response.status_code == 403 and "CSRF" in response.json()["detail"], response.content
    assert started_models() == []
    token = get_token(RequestFactory().get("/"))
    client.cookies["csrftoken"] = token
    response = post("/rest/session", {"x": 1}, client=client, HTTP_X_CSRFTOKEN=token)
    assert response.status_code == 200 and response.json() == 2, response.content


def test_the_rest_of_the_package_does_not_import_drf(commands):
    """A project without DRF uses django_streamer as before."""
    import subprocess
    import sys

    from tests.django.conftest import ROOT

    script = (
        "import sys, django; django.setup()\n"
        "import django_streamer, django_streamer.views, django_streamer.checks\n"
        "django_streamer.BatchedView, django_streamer.get_streamer\n"
        "print(sorted(name for name in sys.modules if name.startswith('rest_framework')))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, env=commands.env(), capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0 and result.stdout.strip() == "[]", (result.stdout, result.stderr)


def _call(port: int, path: str, body: Any, headers: Dict[str, str]) -> Tuple[int, Dict[str, str], Any]:
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}{path}",
        None if body is None else json.dumps(body).encode(),
        {"Content-Type": "application/json", **headers},
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, dict(response.headers), json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, dict(error.headers), json.loads(error.read())


def test_under_gunicorn_refusals_come_first_and_the_threads_calls_are_batched(commands):
    """A real server: gunicorn's gthread worker, one process. Refused
    requests (no key, throttled) never reach the model; accepted ones from
    concurrent threads share model calls; a body sent in chunks is read, by
    each of DRF's parsers."""
    from tests.flask.test_example_classify import upload
    from tests.helpers import post_chunked, shortcut_on, wait_for
    from tests.servers import free_port

    port = free_port()
    commands.start("tests.django.wsgi:application", "--bind", f"127.0.0.1:{port}", "--threads", "8", module="gunicorn")

    def up() -> bool:
        try:
            return _call(port, "/rest/open", {"x": 1}, {})[0] == 200
        except OSError:
            return False

    assert wait_for(up, 60, interval=0.2), "gunicorn did not start"
    before = _call(port, "/rest/outcomes/double", None, {})[2]
    status, headers, body = _call(port, "/rest/double", {"x": 1}, {})
    assert status == 401 and headers["WWW-Authenticate"] == "Key", body
    throttled = [_call(port, "/rest/throttled", {"x": n}, {"Authorization": "Key secret"}) for n in range(4)]
    assert [status for status, _, _ in throttled] == [200, 200, 200, 429], throttled
    assert int(throttled[3][1]["Retry-After"]) > 0 and "throttled" in throttled[3][2]["detail"]
    after = _call(port, "/rest/outcomes/double", None, {})[2]
    assert {k: after[k] - before[k] for k in after if after[k] != before[k]} == {"ok": 3}, "a refused call was queued"

    answers: List[Any] = []
    threads = [threading.Thread(target=lambda x=x: answers.append(_call(port, "/rest/sizes", x, {}))) for x in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert sorted(body[0] for _, _, body in answers) == list(range(6)), answers
    assert max(body[1] for _, _, body in answers) > 1, f"no two requests shared a model call: {answers}"
    status, _, body = post_chunked(port, "/rest/open", b'{"x": 21}', "application/json")
    if not shortcut_on("django-body"):  # Django's own reading reads no body sent in chunks: said so
        assert status == 411 and body["detail"].startswith("a body sent in chunks is read only"), body
        return
    assert (status, body) == (200, 42)
    form = upload(b"\x00" * 15_000, "f.bin")  # read by DRF's multipart parser from the stream
    status, _, body = post_chunked(port, "/rest/upload", form["data"], form["content_type"])
    assert status == 200 and body["length"] == 15_000, body


def test_a_body_drfs_parsers_refuse_is_counted_invalid_whatever_its_status():
    """DRF's own refusal of a body (a 415 for a type no parser reads, a 400
    for malformed JSON) is the client's: counted ``invalid``, never as the
    model's error."""
    before = calls()
    client = APIClient()
    refused = client.post("/rest/open", "x=1", content_type="text/plain")
    assert refused.status_code == 415, refused.content
    malformed = client.post("/rest/open", "{", content_type="application/json")
    assert malformed.status_code == 400, malformed.content
    assert since(before) == {"invalid": 2}
