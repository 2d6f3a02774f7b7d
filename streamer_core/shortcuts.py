"""The places where the project leans on another package's private
workings to serve a request with less, each behind one switch and a
version gate.

A shortcut repeats or skips a step of Flask, werkzeug, gevent, gunicorn,
Django, OpenTelemetry's SDK or redis-py, as the release it was written
against does that step. A new release may add a step or change a rule (a
request-smuggling rule of an HTTP parser, say) without renaming anything,
which no check of attribute names can see. So each shortcut is taken only
where the package's installed release lies in the range the project's CI
runs (its declared floor and its newest, :data:`SHORTCUTS`); anywhere
else, and wherever the switch is off, the package's public path is taken:

- ``STREAMER_SHORTCUTS=0`` in the environment (``0``, ``false``, ``off``
  or ``no``): none in this process;
- ``STREAMER_SHORTCUTS = False`` in a Flask app's config, or
  ``STREAMER["SHORTCUTS"] = False`` in Django's settings: none in that
  app's requests and its gunicorn worker's handler.

The web layers log one line as an app is set up (:func:`say_which`, on
this module's logger, ``streamer_core.shortcuts``) saying which are on,
and why any is off.
"""

from __future__ import annotations

import functools
import logging
import os
import re
from importlib import metadata
from typing import Dict, Iterable, List, NamedTuple, Optional, Tuple

__all__ = [
    "ENVIRONMENT_VARIABLE",
    "SHORTCUTS",
    "Shortcut",
    "allowed",
    "problem",
    "release_problem",
    "switched_off",
    "summary",
    "say_which",
]

logger = logging.getLogger(__name__)

#: The environment variable that turns every shortcut off in a process.
ENVIRONMENT_VARIABLE = "STREAMER_SHORTCUTS"
_OFF = ("0", "false", "off", "no")

Version = Tuple[int, ...]


class Shortcut(NamedTuple):
    """One shortcut: the distribution whose private workings it leans on,
    the releases it is taken on (``lowest`` up to, not including,
    ``below``), and what it saves, in a few words."""

    name: str
    distribution: str
    lowest: Version
    below: Version
    what: str
    #: ``"app"``: an app's setting turns it off too; ``"process"``: only the
    #: environment variable (it serves the whole process, not one app).
    scope: str = "app"

    def tested(self) -> str:
        """The range as the log line says it: ``3.0 to 3.1.x``."""
        below = list(self.below)
        while len(below) > 1 and below[-1] == 0:
            below.pop()
        below[-1] -= 1
        return f"{_dotted(self.lowest)} to {_dotted(tuple(below))}.x"


#: Every shortcut, by name. The ranges: from the floor ``pyproject.toml``
#: declares (CI's floor run, ``.ci/floors.txt``) through the newest release
#: CI installs; raise ``below`` only after a CI run on the newer release.
SHORTCUTS: Dict[str, Shortcut] = {
    shortcut.name: shortcut
    for shortcut in (
        Shortcut(
            "flask-dispatch",
            "flask",
            (3, 0),
            (3, 2),
            "a batched route's request dispatched without werkzeug's URL matching and Flask's empty steps",
        ),
        Shortcut(
            "flask-answer",
            "werkzeug",
            (3, 0),
            (3, 2),
            "a batched route's JSON answer handed to the server without werkzeug's response handling",
        ),
        Shortcut(
            "gevent-reading",
            "gevent",
            (24, 2),
            (27,),
            "request headers read without the email parser, each looked up once (gunicorn -k gevent_pywsgi)",
        ),
        Shortcut(
            "gevent-writing",
            "gevent",
            (24, 2),
            (27,),
            "a response's headers and body sent in one system call (gunicorn -k gevent_pywsgi)",
        ),
        Shortcut(
            "gunicorn-access-log",
            "gunicorn",
            (26, 0),
            (28,),
            "no access-log work for a request where no access log is written (gunicorn -k gevent_pywsgi)",
        ),
        Shortcut(
            "django-body",
            "django",
            (5, 2),
            (6, 0),
            "a batched view's body read once and kept where Django keeps it; a body sent in chunks read",
        ),
        Shortcut(
            "otel-spans",
            "opentelemetry-sdk",
            (1, 40),
            (1, 46),
            "request and batch spans made without the SDK tracer's per-span checks and copies",
            "process",
        ),
        Shortcut(
            "redis-packing",
            "redis",
            (8, 0),
            (8, 3),
            "Redis commands packed by hiredis in one pass over their arguments",
            "process",
        ),
    )
}


def _dotted(version: Version) -> str:
    return ".".join(map(str, version))


@functools.cache
def installed(distribution: str) -> Optional[str]:
    """The installed release of ``distribution``, or ``None``."""
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None


def release_of(text: str) -> Version:
    """A version's release numbers (``"3.1.0rc1"`` -> ``(3, 1, 0)``): a
    pre-release of a release counts as that release."""
    match = re.match(r"\d+(?:\.\d+)*", text.strip().lstrip("vV"))
    return tuple(int(part) for part in match.group(0).split(".")) if match else ()


def switched_off() -> Optional[str]:
    """Why every shortcut is off in this process (the environment variable
    says so), or ``None``."""
    value = os.environ.get(ENVIRONMENT_VARIABLE)
    if value is not None and value.strip().lower() in _OFF:
        return f"{ENVIRONMENT_VARIABLE}={value}"
    return None


def problem(name: str, setting: bool = True, setting_name: str = "") -> Optional[str]:
    """Why the shortcut ``name`` is not taken (the switch off, its package
    not installed, a release outside its range), or ``None`` where it is.
    ``setting``: the app's own switch (``setting_name`` says which), for a
    shortcut of the app's scope."""
    shortcut = SHORTCUTS[name]
    off = switched_off()
    if off is not None:
        return off
    if not setting and shortcut.scope == "app":
        return f"{setting_name or 'the setting'} is False"
    return release_problem(name)


def release_problem(name: str) -> Optional[str]:
    """Why the installed release of the shortcut ``name``'s package rules it
    out (not installed, older or newer than its range), or ``None``."""
    shortcut = SHORTCUTS[name]
    version = installed(shortcut.distribution)
    if version is None:
        return f"{shortcut.distribution} is not installed"
    release = release_of(version)
    if release < shortcut.lowest:
        return f"{shortcut.distribution} {version} is older than the {shortcut.tested()} it is tested on"
    if release >= shortcut.below:
        return f"{shortcut.distribution} {version} is newer than the {shortcut.tested()} it is tested on"
    return None


def allowed(name: str, setting: bool = True) -> bool:
    """Whether the shortcut ``name`` is taken: the switch on (and the app's
    ``setting``), its package installed in its tested range."""
    return problem(name, setting) is None


def summary(names: Iterable[str], setting: bool = True, setting_name: str = "") -> Tuple[int, str]:
    """The log level and line that say which of the shortcuts ``names``
    (those whose package is installed) are on, and why any is off. The
    level is a warning where one is off for its package's release being
    newer than the tested ones: an upgrade that serves more slowly, until
    the project's CI has run on it; else info."""
    on: List[str] = []
    off: Dict[str, List[str]] = {}
    level = logging.INFO
    for name in names:
        shortcut = SHORTCUTS[name]
        version = installed(shortcut.distribution)
        if version is None:
            continue
        why = problem(name, setting, setting_name)
        if why is None:
            on.append(f"{name} ({shortcut.distribution} {version})")
            continue
        off.setdefault(why, []).append(name)
        if " is newer than " in why:
            level = logging.WARNING
    line = "shortcuts through other packages' private workings: on: " + (", ".join(on) or "none")
    if off:
        line += "; off, their public paths taken: " + "; ".join(f"{', '.join(n)} ({why})" for why, n in off.items())
    return level, line


def say_which(names: Iterable[str], setting: bool = True, setting_name: str = "", who: str = "") -> None:
    """Log :func:`summary`'s line for ``who`` (an app's name, say)."""
    level, line = summary(names, setting, setting_name)
    logger.log(level, "%s%s", f"{who}: " if who else "", line)
