"""The settings as documented (the docs' settings reference, which
docs/hooks.py writes from the table; the Django example's README; the Flask
settings module's own is checked in tests/flask/test_settings.py) are the option
table's: each default written once, in ``streamer_core.options.config.OPTIONS``,
and every place that shows it agrees."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path
from typing import Dict

import pytest

import flask_streamer.settings
from streamer_core.options.config import OPTIONS
from streamer_core.web.spec import MODEL_SETTINGS

ROOT = Path(__file__).resolve().parents[1]
#: What a default looks like written down, where it is not its Python repr.
SHOWN_AS = {"prefix": None}  # the app's name (Flask), "django:<model>" (Django): each layer's own rule


def settings_reference() -> str:
    """docs/reference/settings.md as the site shows it: its table written by docs/hooks.py."""
    spec = importlib.util.spec_from_file_location("docs_hooks", ROOT / "docs" / "hooks.py")
    assert spec is not None and spec.loader is not None
    hooks = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hooks)
    page = (ROOT / "docs" / "reference" / "settings.md").read_text()
    return page.replace(hooks.SETTINGS_PLACEHOLDER, hooks.settings_table())


def documented(text: str, row: str) -> Dict[str, str]:
    """``{option: default as written}`` of a table whose rows match ``row``
    (a setting's name, then its default)."""
    return {match.group(1).lower(): match.group(2) for match in re.finditer(row, text, re.MULTILINE)}


def expected(name: str) -> str:
    value = OPTIONS[name].default
    return '"' + value + '"' if isinstance(value, str) else repr(value)


@pytest.mark.parametrize(
    "where, text, pattern",
    [
        (
            "docs/reference/settings.md, Flask's keys",
            settings_reference(),
            r"^\| `[a-z_]+` \| `STREAMER_([A-Z_]+)` \|[^|]*\|[^|]*\| `([^`]+)` \|",
        ),
        (
            "example_django/README.md",
            (ROOT / "example_django" / "README.md").read_text(),
            r"^\|\s*`([A-Z_]+)`\s*\|\s*`([^`]+)`\s*\|",
        ),
    ],
)
def test_each_documented_default_is_the_option_tables(where, text, pattern):
    rows = documented(text, pattern)
    shown = [name for name in MODEL_SETTINGS if name in rows and name not in SHOWN_AS]
    assert len(shown) >= len(MODEL_SETTINGS) - 2, f"{where}: the table was not found ({sorted(rows)})"
    wrong = {name: rows[name] for name in shown if rows[name] != expected(name)}
    assert wrong == {}, f"{where} shows defaults that are not streamer_core.options.config.OPTIONS'"


def test_the_flask_and_django_defaults_are_the_option_tables():
    from django_streamer.conf import DEFAULTS as DJANGO_DEFAULTS

    flask = {name: value for name, value in flask_streamer.settings.DEFAULTS.items() if name != "prefix"}
    django = {field: value for field, value in DJANGO_DEFAULTS.values()}
    assert flask == django == {name: OPTIONS[name].default for name in MODEL_SETTINGS if name != "prefix"}
