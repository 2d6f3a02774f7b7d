"""The Grafana dashboard shipped in ``streamer_core/grafana``: a dashboard
Grafana imports as it is (a datasource variable every panel reads from,
unique panel ids, each panel placed on the grid), and one whose queries
read only metrics the project exports, as both examples serve them on a
live ``/metrics`` (gunicorn on 127.0.0.1, the model's forward pass stubbed
to answer at once), so that a renamed metric cannot leave a dead panel; and
every ``streamer_`` metric they export is on some panel."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Dict, Iterator, List, Set

import pytest

import streamer_core
from tests.helpers import stop_all, wait_for
from tests.servers import free_ports, kill_group

ROOT = Path(__file__).resolve().parents[1]
DASHBOARD = Path(streamer_core.__file__).parent / "grafana" / "streamer-dashboard.json"
STUB = ROOT / "bench" / "apps" / "stub_forward"
DATASOURCE = "${datasource}"
# Words of PromQL that are not metric names (aggregations and functions are
# told by the "(" after them).
KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and", "or", "unless", "offset",
            "inf", "nan"}  # fmt: skip


def dashboard() -> Dict[str, Any]:
    return dict(json.loads(DASHBOARD.read_text()))


def panels(board: Dict[str, Any]) -> List[Dict[str, Any]]:
    """Every panel but the rows, those inside collapsed rows included."""
    found = []
    for panel in board["panels"]:
        if panel["type"] == "row":
            found.extend(panel.get("panels", []))
        else:
            found.append(panel)
    return found


def metric_names(expr: str) -> Set[str]:
    """The metric names a PromQL expression reads: its identifiers once the
    strings, label matchers and ranges are taken out, less functions,
    aggregations (each followed by "(") and keywords."""
    bare = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    bare = re.sub(r"\{[^}]*\}", " ", bare)
    bare = re.sub(r"\[[^\]]*\]", " ", bare)
    bare = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", bare)
    names = set()
    for match in re.finditer(r"(?<![\w.$])([a-zA-Z_:][a-zA-Z0-9_:]*)(\s*\()?", bare):
        name, call = match.group(1), match.group(2)
        if not call and name.lower() not in KEYWORDS:
            names.add(name)
    return names


def queries(board: Dict[str, Any]) -> List[str]:
    """Every PromQL query of the dashboard: its panels' and its variables'."""
    found = [target["expr"] for panel in panels(board) for target in panel["targets"]]
    for variable in board["templating"]["list"]:
        if variable["type"] == "query":
            query = variable["query"]
            text = query["query"] if isinstance(query, dict) else query
            match = re.fullmatch(r"label_values\((.*),\s*\w+\)", text, re.S)
            assert match, f"variable {variable['name']}: {text}"
            found.append(match.group(1))
    return found


def test_metric_names_are_read_out_of_promql() -> None:
    expr = 'histogram_quantile(0.99, sum by (model, le) (rate(x_bucket{job=~"$job", a="b(c)"}[$__rate_interval])))'
    assert metric_names(expr) == {"x_bucket"}
    assert metric_names("sum(rate(a_total[5m])) / on (model) group_left b offset 5m > bool 0") == {"a_total", "b"}
    assert metric_names("min by (model) (c < +Inf)") == {"c"}


def test_the_dashboard_is_one_grafana_imports_as_it_is() -> None:
    board = dashboard()
    assert board["title"] and board["uid"] and isinstance(board["schemaVersion"], int)
    assert board.get("id") is None, "an exported dashboard carries no database id"
    variables = {variable["name"]: variable for variable in board["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    for name in ("job", "model"):
        assert variables[name]["type"] == "query" and variables[name]["datasource"]["uid"] == DATASOURCE
        assert variables[name]["multi"] and variables[name]["includeAll"]
    every = board["panels"] + [inner for row in board["panels"] for inner in row.get("panels", [])]
    ids = [panel["id"] for panel in every]
    assert len(ids) == len(set(ids)), "panel ids are unique"
    for panel in every:
        grid = panel["gridPos"]
        assert all(isinstance(grid[key], int) for key in "hwxy") and grid["h"] > 0 and grid["w"] > 0
        assert grid["x"] + grid["w"] <= 24, panel["title"]
    for panel in panels(board):
        assert panel["datasource"]["uid"] == DATASOURCE, panel["title"]
        assert panel["title"] and panel["targets"], panel["title"]
        refs = [target["refId"] for target in panel["targets"]]
        assert len(refs) == len(set(refs)), panel["title"]
        for target in panel["targets"]:
            assert target["datasource"]["uid"] == DATASOURCE, panel["title"]
            expr = target["expr"]
            assert 'job=~"$job"' in expr and 'model=~"$model"' in expr, f"{panel['title']}: {expr}"
            assert metric_names(expr), f"{panel['title']} reads no metric: {expr}"


def test_the_dashboard_ships_as_package_data() -> None:
    text = (ROOT / "pyproject.toml").read_text()
    assert re.search(r'^streamer_core = \[[^\]]*"grafana/\*\.json"', text, re.M), "pyproject's package-data"


class Example:
    """An example served by gunicorn with its own gunicorn.conf.py, its
    model's forward pass stubbed (``bench/apps/stub_forward``)."""

    def __init__(self, name: str, port: int, folder: Path) -> None:
        self.name = name
        self.port = port
        app = "example_flask:create_app()" if name == "flask" else "example_django.wsgi"
        argv = [sys.executable, "-m", "gunicorn", "-c", f"example_{name}/gunicorn.conf.py", "--bind",
                f"127.0.0.1:{port}", app]  # fmt: skip
        unset = ("FLASK_", "STREAMER_", "DJANGO_SETTINGS_MODULE", "PROMETHEUS_MULTIPROC_DIR")
        env = {key: value for key, value in os.environ.items() if not key.startswith(unset)}
        env.update(PYTHONPATH=os.pathsep.join([str(ROOT), str(STUB)]), PYTHONUNBUFFERED="1", PIN_WORKERS="0")
        env.update(TOKENIZERS_PARALLELISM="false")
        self.log = folder / f"{name}.log"
        with open(self.log, "wb") as out:
            self.process = subprocess.Popen(
                argv, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )

    def get(self, path: str, body: Any = None) -> bytes:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(f"http://127.0.0.1:{self.port}{path}", data,
                                         {"Content-Type": "application/json"})  # fmt: skip
        with urllib.request.urlopen(request, timeout=30) as response:
            return bytes(response.read())

    def ready(self) -> bool:
        try:
            self.get("/readyz")
            return True
        except OSError:
            return False

    def stop(self) -> None:
        kill_group(self.process)


def exported(text: str) -> Set[str]:
    """The names a query can read from a scrape: each family's samples, as
    Prometheus stores them (a counter's ``_total``, a histogram's
    ``_bucket``, ``_sum`` and ``_count``), whether or not it has samples yet."""
    from prometheus_client.parser import text_string_to_metric_families

    names = set()
    for family in text_string_to_metric_families(text):
        suffixes = {"counter": ["_total"], "histogram": ["_bucket", "_sum", "_count"]}.get(family.type, [""])
        names.update(family.name + suffix for suffix in suffixes)
        names.update(sample.name for sample in family.samples)
    return names


@pytest.fixture(scope="module")
def scrapes(tmp_path_factory: Any) -> Iterator[Dict[str, str]]:
    """Both examples' ``/metrics``, once each has answered a few calls."""
    if importlib.util.find_spec("sentence_transformers") is None or importlib.util.find_spec("gunicorn") is None:
        pytest.skip("the examples need the 'example' extra")
    folder = tmp_path_factory.mktemp("dashboard")
    ports = free_ports(2)
    examples: List[Example] = []
    try:
        for name, port in zip(("flask", "django"), ports):
            examples.append(Example(name, port, folder))
        for example in examples:
            assert wait_for(example.ready, 180, interval=0.2), example.log.read_text()[-3000:]
        texts = {}
        for example in examples:
            with ThreadPoolExecutor(4) as pool:
                list(pool.map(example.get, ["/stream"] * 8, [{"s": f"sentence {n}"} for n in range(8)]))
            texts[example.name] = example.get("/metrics").decode()
        yield texts
    finally:
        stop_all(example.stop for example in examples)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("example", ["flask", "django"])
def test_every_metric_the_dashboard_reads_is_exported(scrapes: Dict[str, str], example: str) -> None:
    names = exported(scrapes[example])
    assert "streamer_requests_total" in names and "streamer_batch_size_bucket" in names, scrapes[example][:2000]
    read = {name for expr in queries(dashboard()) for name in metric_names(expr)}
    assert read, "the dashboard reads metrics"
    assert sorted(read - names) == [], f"the dashboard reads metrics {example}'s /metrics does not export"


@pytest.mark.timeout(300)
@pytest.mark.parametrize("example", ["flask", "django"])
def test_every_streamer_metric_exported_is_on_the_dashboard(scrapes: Dict[str, str], example: str) -> None:
    """A histogram counts as shown when any of its series is read."""
    from prometheus_client.parser import text_string_to_metric_families

    read = {name for expr in queries(dashboard()) for name in metric_names(expr)}
    families = [f for f in text_string_to_metric_families(scrapes[example]) if f.name.startswith("streamer_")]
    assert families
    unshown = [
        family.name
        for family in families
        if not {
            family.name,
            f"{family.name}_total",
            f"{family.name}_bucket",
            f"{family.name}_sum",
            f"{family.name}_count",
        }
        & read  # fmt: skip
    ]
    assert unshown == [], "exported, and on no panel"
