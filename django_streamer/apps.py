"""The app's configuration: it registers the system checks and refuses
settings so wrong that no request could be served. No streamer starts at
import or in ``ready()``, so ``migrate``, ``shell`` and the tests never spawn
a worker; the streamers start on first use
(:func:`django_streamer.get_streamer`) and the Redis workers with
``manage.py run_gpu_workers``."""

from __future__ import annotations

import sys

from django.apps import AppConfig
from django.core import checks
from django.core.exceptions import ImproperlyConfigured


class DjangoStreamerConfig(AppConfig):
    name = "django_streamer"
    verbose_name = "Dynamic batching (streamer_core)"

    def ready(self) -> None:
        from .checks import check_streamer_settings, check_view_models

        checks.register(check_streamer_settings, "django_streamer")
        checks.register(check_view_models, "django_streamer", checks.Tags.urls)
        if not _run_by_a_management_command():
            refuse_wrong_settings()
        say_which_shortcuts()


#: The shortcuts (:mod:`streamer_core.shortcuts`) a project's batched views may take.
SHORTCUTS = ("django-body", "gevent-reading", "gevent-writing", "gunicorn-access-log", "otel-spans", "redis-packing")


def say_which_shortcuts() -> None:
    """Log the line that says which shortcuts through other packages'
    workings this project's views take, and why any is off."""
    from streamer_core import shortcuts

    from .conf import setting_path
    from .conf import shortcuts as setting

    shortcuts.say_which(SHORTCUTS, setting(), setting_path("SHORTCUTS"))


def refuse_wrong_settings() -> None:
    """Raise :class:`ImproperlyConfigured` naming every problem of
    ``settings.STREAMER`` and its fix. System checks run only under
    ``manage.py``: without this, gunicorn or uvicorn would boot with a wrong
    setting and answer every batched request with an error."""
    from .checks import HINTS
    from .conf import read_settings

    _specs, problems = read_settings()
    if problems:
        lines = [f"{problem.message} ({problem.id}). {HINTS.get(problem.id, '')}".strip() for problem in problems]
        raise ImproperlyConfigured("settings.STREAMER is wrong:\n  " + "\n  ".join(lines))


def _run_by_a_management_command() -> bool:
    """Whether Django is being set up by ``manage.py`` (or ``django-admin``),
    whose system checks report wrong settings in their own way, with ids."""
    frame = sys._getframe()
    while frame is not None:
        if frame.f_globals.get("__name__", "").startswith("django.core.management"):
            return True
        frame = frame.f_back  # type: ignore[assignment]
    return False
