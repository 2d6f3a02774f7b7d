"""The overload rule's settings (``STREAMER["OVERLOAD_AFTER"]``,
``["OVERLOAD_WAIT"]``) reach each model's streamer, and a call it refuses
is a 503 with ``Retry-After: 1``."""

from __future__ import annotations

from typing import Any

from django_streamer.registry import get_streamer


def test_the_projects_overload_settings_reach_a_models_streamer(streamer_settings: Any) -> None:
    streamer_settings(OVERLOAD_AFTER=0.3, OVERLOAD_WAIT=0.7)
    config = get_streamer("double")._config
    assert (config.overload_after, config.overload_wait) == (0.3, 0.7)
    streamer_settings(OVERLOAD_AFTER=None)
    config = get_streamer("double")._config
    assert config.overload_after is None, "the switch off"
