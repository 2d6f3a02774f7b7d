"""The wheel holds the library and nothing else: streamer_core,
flask_streamer and django_streamer with their data files. The examples,
their models, the tests and the benchmarks run from the checkout; a wheel
that installed them would put packages called ``example_flask`` or
``tests`` beside a user's own."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import List

import pytest

ROOT = Path(__file__).resolve().parents[1]
LIBRARY = {"streamer_core", "flask_streamer", "django_streamer"}
#: Folders of the checkout that are not the library.
NOT_LIBRARY = {"example_flask", "example_django", "example_models", "tests", "bench", "docs"}


#: What a copy of the checkout leaves out: environments, caches, build output.
LEFT_OUT = shutil.ignore_patterns(
    ".git", ".venv*", "__pycache__", "*.egg-info", ".*_cache", "build", "dist", "mutants", "results", ".venvs"
)


@pytest.fixture(scope="module")
def wheel_names(tmp_path_factory: pytest.TempPathFactory) -> List[str]:
    """The file names inside the wheel pip builds from a copy of the
    checkout (so that setuptools' build/ and egg-info land there, not here),
    with the setuptools already installed: no download, a few seconds."""
    source = tmp_path_factory.mktemp("source") / "checkout"
    shutil.copytree(ROOT, source, ignore=LEFT_OUT)
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-cache-dir", "-q",
         "-w", str(out), str(source)],
        check=True, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    [wheel] = out.glob("streamer_core-*.whl")
    with zipfile.ZipFile(wheel) as opened:
        return opened.namelist()


def test_the_wheel_holds_the_three_library_packages_and_nothing_else(wheel_names):
    tops = {name.split("/")[0] for name in wheel_names}
    dist_info = {top for top in tops if top.endswith(".dist-info")}
    assert len(dist_info) == 1, tops
    assert tops - dist_info == LIBRARY, f"beside the library: {sorted(tops - dist_info - LIBRARY)}"


def test_no_example_test_or_benchmark_module_is_in_the_wheel(wheel_names):
    stray = [name for name in wheel_names if set(Path(name).parts) & NOT_LIBRARY]
    assert not stray, stray
    assert not [name for name in wheel_names if "/" not in name], "a top-level module (manage.py, gunicorn.conf.py)"


def test_the_library_s_data_files_are_in_the_wheel(wheel_names):
    for package in LIBRARY:
        assert f"{package}/py.typed" in wheel_names, package
        assert f"{package}/__init__.py" in wheel_names, package
    dashboards = [name for name in wheel_names if name.startswith("streamer_core/grafana/") and name.endswith(".json")]
    shipped = sorted(path.name for path in (ROOT / "streamer_core" / "grafana").glob("*.json"))
    assert shipped and sorted(Path(name).name for name in dashboards) == shipped
