"""MkDocs hooks of the documentation site (``hooks:`` in mkdocs.yml).

- The settings reference (docs/reference/settings.md) is written from the one
  options table, :data:`streamer_core.options.config.OPTIONS`, and the names
  the Flask and Django layers give each option, so that it cannot drift from
  the code: the page holds a placeholder, :func:`settings_table` the rows.
- The benchmark's figures (bench/plots/*.png) are served beside the
  performance page that shows them, from where the benchmark writes them.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, List

ROOT = Path(__file__).resolve().parents[1]
# The checkout's packages, as the tests import them, even where another copy is installed.
sys.path.insert(0, str(ROOT))
#: Where docs/reference/settings.md wants the table.
SETTINGS_PLACEHOLDER = "<!-- settings-table -->"
#: Where it wants the Flask app's operations routes.
ROUTES_PLACEHOLDER = "<!-- flask-routes-table -->"
#: What each of the Flask app's operations routes serves (flask_streamer.settings.APP_DEFAULTS).
ROUTE_MEANINGS = {
    "metrics_route": 'e.g. `"/metrics"`: Prometheus metrics (the `metrics` extra, [Metrics](../operations.md#metrics))',
    "health_route": 'e.g. `"/healthz"`: liveness, 200 while the process serves',
    "ready_route": 'e.g. `"/readyz"`: readiness, 200 only when every batched route can serve now',
}


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def shown(value: Any) -> str:
    """A default as the table writes it: a string in double quotes, else its repr."""
    return '"' + value + '"' if isinstance(value, str) else repr(value)


def settings_rows() -> List[List[str]]:
    """One row per option of ``OPTIONS``: the option, its Flask ``app.config``
    key, its Django ``STREAMER`` key, the environment variable it is read
    from, its default, its unit and what it does."""
    from django_streamer.conf import DEFAULT_PREFIX, MODEL_ONLY, REQUEST_KEYS
    from django_streamer.conf import DEFAULTS as DJANGO_MODEL_KEYS
    from flask_streamer.settings import APP_OPTIONS, setting_name
    from flask_streamer.settings import DEFAULTS as FLASK_MODEL_KEYS
    from streamer_core.options.config import OPTIONS
    from streamer_core.shortcuts import ENVIRONMENT_VARIABLE as SHORTCUTS_VARIABLE

    flask = set(FLASK_MODEL_KEYS) | set(APP_OPTIONS)
    django_top = {field for field, _ in DJANGO_MODEL_KEYS.values()} | {key.lower() for key in REQUEST_KEYS} | {"prefix"}
    django_model = {field for field, _ in DJANGO_MODEL_KEYS.values()} | set(MODEL_ONLY.values())
    rows = []
    for option in OPTIONS.values():
        name = option.name
        flask_key = f"`{setting_name(name)}`" if name in flask else "—"
        where = []
        if name in django_top:
            where.append(f'`STREAMER["{name.upper()}"]`')
        if name in django_model:
            where.append(f'`STREAMER["MODELS"][model]["{name.upper()}"]`')
        variables = [f"`FLASK_{setting_name(name)}`"] if name in flask else []
        if name == "shortcuts":
            variables.append(f"`{SHORTCUTS_VARIABLE}` (the whole process)")
        if name == "prefix":
            default = f'the app\'s name (Flask), `"{DEFAULT_PREFIX}"` (Django)'
        else:
            default = f"`{shown(option.default)}`"
        unit = "seconds" if option.kind == "seconds" else "bytes" if name.endswith("_bytes") else ""
        django_keys, environment = ", ".join(where) or "—", ", ".join(variables) or "—"
        rows.append([f"`{name}`", flask_key, django_keys, environment, default, unit, _cell(option.help)])
    return rows


def settings_table() -> str:
    """The settings reference's table, as markdown."""
    head = ["option", "Flask `app.config`", "Django `STREAMER`", "environment", "default", "unit", "what it does"]
    lines = ["| " + " | ".join(head) + " |", "| " + " | ".join("---" for _ in head) + " |"]
    lines += ["| " + " | ".join(row) + " |" for row in settings_rows()]
    return "\n".join(lines)


def routes_table() -> str:
    """The Flask app's operations routes (``STREAMER_METRICS_ROUTE`` and its kin)."""
    from flask_streamer.settings import APP_DEFAULTS, setting_name

    lines = ["| Flask `app.config` | default | what it serves |", "| --- | --- | --- |"]
    for name, default in APP_DEFAULTS.items():
        lines.append(f"| `{setting_name(name)}` | `{default!r}` | {ROUTE_MEANINGS[name]} |")
    return "\n".join(lines)


def on_page_markdown(markdown: str, page: Any, **_: Any) -> str:
    if page.file.src_uri == "reference/settings.md":
        markdown = markdown.replace(SETTINGS_PLACEHOLDER, settings_table()).replace(ROUTES_PLACEHOLDER, routes_table())
    return markdown


def on_files(files: Any, config: Any, **_: Any) -> Any:
    from mkdocs.structure.files import File

    for figure in sorted((ROOT / "bench" / "plots").glob("*.png")):
        path = figure.relative_to(ROOT).as_posix()
        files.append(File(path, str(ROOT), config["site_dir"], config["use_directory_urls"]))
    return files
