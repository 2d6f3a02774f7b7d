"""The shell commands of the README and the docs (docs/**/*.md) run as
pasted into a fresh checkout, where what the project installs is in
``.venv/bin`` and nowhere on ``PATH``."""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import List

ROOT = Path(__file__).resolve().parents[1]

#: The programs the README's install commands put in .venv/bin.
INSTALLED = {
    "streamer-worker",
    "flask",
    "gunicorn",
    "uvicorn",
    "uwsgi",
    "python",
    "pytest",
    "ruff",
    "mypy",
    "django-admin",
}


def commands(text: str) -> List[str]:
    """Each command of the README's ``bash`` blocks: lines joined where
    they end in a backslash, split at ``&&``, environment assignments dropped."""
    found = []
    for block in re.findall(r"```bash\n(.*?)```", text, re.S):
        for line in block.replace("\\\n", " ").splitlines():
            line = line.split("#", 1)[0].strip()
            for command in filter(None, (part.strip() for part in line.split("&&"))):
                words = [word for word in shlex.split(command) if not re.match(r"^[A-Z_]+=", word)]
                if words and words[0] != "export":
                    found.append(" ".join(words))
    return found


def documentation() -> str:
    """The README and every page of the docs site, one text."""
    return "\n".join(path.read_text() for path in [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))])


def test_every_command_of_the_project_is_run_from_the_virtual_environment():
    found = commands(documentation())
    bare = [command for command in found if command.split()[0] in INSTALLED]
    assert not bare, f"as pasted into a fresh shell these are 'command not found': {bare}"
    assert any(command.startswith(".venv/bin/streamer-worker ") for command in found), "the worker command is shown"
