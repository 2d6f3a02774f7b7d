"""The documentation holds: every Python snippet of README.md and docs/ is a
file of docs/snippets/ that these tests run (or is marked as not run, with
the reason), the settings reference the hook writes names every option of
the one options table, the README stays a PyPI page, and docs/layout.md
names every package of the tree and nothing that is not there. The site
itself is built with warnings as errors by .ci/run (`mkdocs build --strict`:
a broken link or anchor fails it)."""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
import textwrap
import uuid
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType
from typing import Iterator, List, Tuple

import pytest
from flask.testing import FlaskClient

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
SNIPPETS = DOCS / "snippets"
#: A ```python block shown but not run says why on the line before it.
NOT_RUN = re.compile(r"<!-- not run: (.+?) -->\n$")
INCLUDE = re.compile(r'^--8<-- "([^"]+)"$')


def pages() -> List[Path]:
    return [ROOT / "README.md", *sorted(DOCS.rglob("*.md"))]


def python_blocks(text: str) -> Iterator[Tuple[str, str]]:
    """Each ```python block of ``text``: what stands before it, and its body."""
    for match in re.finditer(r"```python\n(.*?)```", text, re.S):
        yield text[: match.start()], match.group(1)


def section(spec: str) -> str:
    """A snippet as pymdownx.snippets includes it: ``path`` or ``path:name``
    (the lines between ``# --8<-- [start:name]`` and ``[end:name]``)."""
    path, _, name = spec.partition(":")
    lines = (ROOT / path).read_text().splitlines()
    if name:
        start = lines.index(f"# --8<-- [start:{name}]")
        lines = lines[start + 1 : lines.index(f"# --8<-- [end:{name}]")]
    return "\n".join(lines).strip("\n")


def snippet_sections() -> List[str]:
    found = []
    for path in sorted(SNIPPETS.glob("*.py")):
        relative = path.relative_to(ROOT).as_posix()
        names = re.findall(r"^# --8<-- \[start:(\w+)\]$", path.read_text(), re.M)
        found += [section(f"{relative}:{name}") for name in names]
    return found


def load(name: str) -> ModuleType:
    """The snippet file ``docs/snippets/<name>.py``, imported under a name of its own."""
    spec = importlib.util.spec_from_file_location(f"docs_snippet_{name}_{uuid.uuid4().hex}", SNIPPETS / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@contextmanager
def flask_snippet(name: str) -> Iterator[FlaskClient]:
    """A test client of the app the Flask snippet ``name`` makes; its
    streamers closed afterwards, whatever the test found."""
    snippet = load(name)
    try:
        yield snippet.app.test_client()
    finally:
        snippet.streamer.close(snippet.app)


# -- every snippet is run, or says why not -----------------------------------------


def test_every_python_block_comes_from_a_snippet_file_or_says_why_it_is_not_run():
    sections = snippet_sections()
    unchecked = []
    for page in pages():
        for before, body in python_blocks(page.read_text()):
            includes = [INCLUDE.match(line) for line in body.splitlines() if line.strip()]
            if includes and all(includes):
                for include in includes:
                    assert include is not None
                    assert (ROOT / include.group(1).partition(":")[0]).is_file(), include.group(1)
                    assert include.group(1).startswith("docs/snippets/"), include.group(1)
                    section(include.group(1))  # the section is there
            elif body.strip("\n") in sections:
                pass  # README.md: the snippet's text as it is, where GitHub and PyPI do not include files
            elif not NOT_RUN.search(before):
                unchecked.append(f"{page.relative_to(ROOT)}: {body.splitlines()[0]}")
    assert unchecked == [], "neither from docs/snippets/ nor marked <!-- not run: why -->"


def test_the_readme_shows_a_flask_and_a_django_snippet_that_are_run():
    text = (ROOT / "README.md").read_text()
    bodies = [body.strip("\n") for _, body in python_blocks(text)]
    assert section("docs/snippets/flask_app.py:app") in bodies
    assert section("docs/snippets/django_views.py:views") in bodies
    assert section("docs/snippets/django_settings.py:settings") in bodies


def test_the_flask_quickstart_answers_each_request():
    with flask_snippet("flask_app") as client:
        response = client.post("/stream", data={"s": "Happy birthday to you."})
        assert response.status_code == 200, response.get_data(as_text=True)
        assert response.get_json() == len("Happy birthday to you.")
        assert client.post("/stream", json={"s": "abc"}).get_json() == 3


def test_many_inputs_in_one_request_are_answered_in_order():
    with flask_snippet("flask_many") as client:
        response = client.post("/embed", json={"texts": ["a", "bbb", "cc"]})
        assert response.status_code == 200, response.get_data(as_text=True)
        assert response.get_json() == [1, 3, 2]


def test_the_routes_decorators_refuse_a_request_without_its_token():
    with flask_snippet("flask_decorators") as client:
        assert client.post("/stream", json="abcd").status_code == 401
        response = client.post("/stream", json="abcd", headers={"Authorization": "Bearer secret"})
        assert response.status_code == 200, response.get_data(as_text=True)
        assert response.get_json() == 4


def test_priority_routes_share_one_model():
    with flask_snippet("priorities_flask") as client:
        assert client.post("/search", json="abc").get_json() == 3
        response = client.post("/reindex", json=["a", "bb"], headers={"X-Priority": "1"})
        assert response.status_code == 200, response.get_data(as_text=True)
        assert response.get_json() == [1, 2]
        assert client.post("/reindex", json=["a"], headers={"X-Priority": "3"}).status_code == 400


def test_the_engine_without_a_web_framework():
    snippet = load("core_threaded")
    assert snippet.outputs == [len("from async code")]
    with pytest.raises(Exception, match="closed"):
        snippet.streamer.predict(["after close"])


def test_priority_levels_on_a_streamer():
    snippet = load("priorities_core")
    try:
        assert snippet.streamer.predict(["abc"], priority=1) == [3]
    finally:
        snippet.streamer.close()


def test_a_gunicorn_config_of_your_own_gets_the_hooks():
    snippet = load("gunicorn_conf")
    for hook in ("child_exit", "on_exit", "on_starting", "post_worker_init", "pre_fork"):
        assert callable(getattr(snippet, hook))


#: A Django project of the README's settings and views, served in a process of
#: its own (the suite's other Django tests set up tests.django.settings), on the
#: thread backend, its model a ManagedModel in a module myapp.ml written here.
DJANGO_PROJECT = """
import json, runpy, sys
import django
from django.conf import settings
from django.urls import path

snippets = sys.argv[1]
given = runpy.run_path(snippets + "/django_settings.py")
apps = [app for app in given["INSTALLED_APPS"] if app is not Ellipsis]
streamer = dict(given["STREAMER"], BACKEND="thread")
settings.configure(
    DEBUG=False, ALLOWED_HOSTS=["testserver"], ROOT_URLCONF=__name__, SECRET_KEY="docs",
    INSTALLED_APPS=["django.contrib.contenttypes", "django.contrib.auth", *apps], STREAMER=streamer,
)
django.setup()
views = runpy.run_path(snippets + "/django_views.py")
urlpatterns = [path("stream", views["stream"]), path("similar", views["similar"])]
from django.core.management import call_command
from django.test import Client
from django_streamer import close_streamers

call_command("check")
client = Client()
answers = {
    "json": client.post("/stream", {"s": "abcd"}, content_type="application/json").json(),
    "form": client.post("/stream", {"s": "abc"}).json(),
    "similar": client.get("/similar").json(),
}
close_streamers()
print(json.dumps(answers))
"""

MODEL = """
from streamer_core import ManagedModel


class EmbeddingModel(ManagedModel):
    def init_model(self):
        self.scale = 1.0

    def predict(self, batch):
        return [[self.scale * len(text)] for text in batch]
"""


def test_the_django_settings_and_views_serve_a_model(tmp_path):
    (tmp_path / "myapp").mkdir()
    (tmp_path / "myapp" / "__init__.py").write_text("")
    (tmp_path / "myapp" / "ml.py").write_text(textwrap.dedent(MODEL))
    (tmp_path / "project.py").write_text(DJANGO_PROJECT)
    env_path = f"{tmp_path}:{ROOT}"
    done = subprocess.run(
        [sys.executable, str(tmp_path / "project.py"), str(SNIPPETS)],
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": env_path},
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    answers = json.loads(done.stdout.strip().splitlines()[-1])
    assert answers == {"json": [4.0], "form": [3.0], "similar": {"vectors": [[10.0]]}}


# -- the settings reference ------------------------------------------------------------


def hooks() -> ModuleType:
    spec = importlib.util.spec_from_file_location("docs_hooks", DOCS / "hooks.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_settings_reference_names_every_option_of_the_table():
    from flask_streamer.settings import APP_DEFAULTS
    from streamer_core.options.config import OPTIONS

    page = (DOCS / "reference" / "settings.md").read_text()
    assert hooks().SETTINGS_PLACEHOLDER in page and hooks().ROUTES_PLACEHOLDER in page
    table = hooks().settings_table()
    rows = {match.group(1): match.group(0) for match in re.finditer(r"^\| `([a-z_]+)` \|.*$", table, re.M)}
    assert list(rows) == list(OPTIONS)
    assert '`STREAMER_BATCH_SIZE` | `STREAMER["BATCH_SIZE"]`' in rows["batch_size"]
    assert "`FLASK_STREAMER_BACKEND`" in rows["backend"]
    assert "`STREAMER_SHORTCUTS` (the whole process)" in rows["shortcuts"]
    for name in APP_DEFAULTS:
        assert f"`STREAMER_{name.upper()}`" in hooks().routes_table()


# -- the README ------------------------------------------------------------------------


def test_the_readme_is_a_pypi_page():
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) < 300


def test_the_readmes_links_to_the_docs_are_there():
    text = (ROOT / "README.md").read_text()
    links = re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", text)
    local = [link for link in links if not link.startswith("http")]
    assert any(link.startswith("docs/") for link in local)
    assert [link for link in local if not (ROOT / link).exists()] == []


def test_ci_runs_the_readmes_test_command():
    """The second of the two commands a newcomer runs is what .ci/run's
    first step runs (which builds the docs too)."""
    text = (ROOT / "README.md").read_text()
    command = next(line for line in text.splitlines() if line.startswith("python3 -m venv") and "[test]" in line)
    ci = (ROOT / ".ci" / "run").read_text().replace("\\\n", " ")
    ci = re.sub(r"\s+", " ", ci)
    for part in command.split(" && "):
        assert part.strip() in ci, part


# -- the layout page ---------------------------------------------------------------------

PACKAGES = ("streamer_core", "flask_streamer", "django_streamer")
BESIDE = ("example_models", "example_flask", "example_django")


def test_the_layout_page_names_every_package_and_only_what_is_there():
    page = (DOCS / "layout.md").read_text()
    named = set(re.findall(r"`([A-Za-z_][\w./-]*)`", page))
    packages = [
        path.parent.relative_to(ROOT).as_posix() + "/"
        for root in PACKAGES
        for path in sorted((ROOT / root).rglob("__init__.py"))
        if "__pycache__" not in path.parts
    ]
    missing = [package for package in packages if package not in named]
    assert missing == [], "packages docs/layout.md does not name"
    beside = [name + "/" for name in BESIDE if (ROOT / name).is_dir()]
    assert [name for name in beside if name not in named] == []
    paths = [name for name in named if name.endswith((".py", "/")) and "/" in name.rstrip("/")]
    paths += [name for name in named if name.endswith("/") and name.rstrip("/") in (*PACKAGES, *BESIDE)]
    assert len(paths) > 20, "the page's paths are read"
    gone = [name for name in paths if not (ROOT / name).exists()]
    assert gone == [], "docs/layout.md names what is not in the tree"
