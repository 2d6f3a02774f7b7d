"""The app's configuration: it registers the system checks, and nothing
else. No streamer starts at import or in ``ready()``, so ``migrate``,
``shell`` and the tests never spawn a worker; the streamers start on first
use (:func:`django_streamer.get_streamer`) and the Redis workers with
``manage.py run_gpu_workers``."""

from __future__ import annotations

from django.apps import AppConfig
from django.core import checks


class DjangoStreamerConfig(AppConfig):
    name = "django_streamer"
    verbose_name = "Dynamic batching (streamer_core)"

    def ready(self) -> None:
        from .checks import check_streamer_settings, check_view_models

        checks.register(check_streamer_settings, "django_streamer")
        checks.register(check_view_models, "django_streamer", checks.Tags.urls)
