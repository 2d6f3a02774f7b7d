"""System checks of ``settings.STREAMER``, run by ``manage.py check`` (and
before ``runserver``, ``migrate`` and ``run_gpu_workers``).

The ids are stable; each error names the setting to change:

======================  =================================================================
id                      what is wrong
======================  =================================================================
django_streamer.E001    ``STREAMER`` is missing or not a dict; ``MODELS`` is missing,
                        empty or not a dict; a model's entry is not a dict or its name
                        is not a non-empty string without ``:``
django_streamer.E002    ``BACKEND`` is not ``"thread"``, ``"process"`` or ``"redis"``
django_streamer.E003    ``MODEL`` is missing, does not import, or is neither a
                        ManagedModel subclass nor a function taking a list
django_streamer.E004    ``BATCH_SIZE``, ``WORKER_NUM``, ``MODEL_THREADS`` or ``MAX_QUEUE``
                        is not a whole number >= 1
django_streamer.E005    ``MAX_LATENCY`` (>= 0) or ``TIMEOUT`` (> 0) is not a number
                        of seconds of at most a day (86400)
django_streamer.E006    ``CUDA_DEVICES`` is not a list of device indexes or GPU UUIDs
                        (or a string such as ``"0,1"``)
django_streamer.E007    the redis backend without ``REDIS_URL``, or a malformed one
django_streamer.E008    an unknown key in ``STREAMER`` or in a model's entry (a typo)
django_streamer.E009    another option is wrong: ``PREFIX``, ``CODEC``, ``INIT_ARGS``,
                        ``INIT_KWARGS``, ``ITEM_COST``, ``MAX_BATCH_COST``,
                        ``BATCH_COST``; ``MODEL_THREADS`` above 1 on the process or
                        redis backend
django_streamer.E010    a batched view names a model that ``STREAMER["MODELS"]`` lacks
django_streamer.E011    a batched view's ``priority`` is not a level of its model, or
                        its ``priority_header`` is on a model of one level
======================  =================================================================

Checking imports the modules named by ``MODEL`` (that is how E003 knows they
import) but builds no model and starts nothing.
"""

from __future__ import annotations

from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

from django.apps import AppConfig
from django.core.checks import CheckMessage, Error

from streamer_core.options.redis_address import ADDRESS_FORMS
from streamer_core.web.spec import ModelSpec

from .conf import read_settings, setting_path

__all__ = ["HINTS", "check_streamer_settings", "check_view_models"]

#: The hint shown with each error id.
HINTS: Dict[str, str] = {
    "django_streamer.E001": (
        "Describe your models in settings.py: STREAMER = {'MODELS': {'embed': {'MODEL': 'myapp.ml.EmbeddingModel'}}}."
    ),
    "django_streamer.E002": "Set BACKEND to 'thread' (default), 'process' or 'redis'.",
    "django_streamer.E003": (
        "MODEL is an import path such as 'myapp.ml.EmbeddingModel' (or 'myapp.ml:EmbeddingModel') naming a "
        "streamer_core.ManagedModel subclass or a function that takes a list of inputs and returns a list."
    ),
    "django_streamer.E004": "Use a whole number of at least 1 (MAX_QUEUE may also be None for no limit).",
    "django_streamer.E005": (
        "Give seconds as a number of at most 86400 (a day): MAX_LATENCY >= 0 (e.g. 0.05), TIMEOUT > 0 (e.g. 20)."
    ),
    "django_streamer.E006": (
        "Use a list such as [0, 1], the string '0,1' or 'cuda:0', GPU UUIDs ('GPU-...'), or None to leave the "
        "devices alone."
    ),
    "django_streamer.E007": (
        "Set REDIS_URL, at the top level or in the model's entry, to where Redis is: "
        f"{ADDRESS_FORMS}, e.g. 'redis://127.0.0.1:6379/0', 'redis+sentinel://host:26379,host:26380/mymaster/0' "
        "or 'redis+cluster://host:7000,host:7001'."
    ),
    "django_streamer.E008": "Remove the key or correct its spelling; see django_streamer.conf for every key.",
    "django_streamer.E009": "See django_streamer.conf for what each key takes.",
    "django_streamer.E010": "Add the model to STREAMER['MODELS'] or correct the name given to the view.",
    "django_streamer.E011": (
        "Give the view a priority from 1 (the highest) to the model's PRIORITY_LEVELS, or raise PRIORITY_LEVELS; "
        "priority_header needs PRIORITY_LEVELS of 2 or more."
    ),
}


def check_streamer_settings(app_configs: Optional[Sequence[AppConfig]] = None, **kwargs: Any) -> List[CheckMessage]:
    """Every problem of ``settings.STREAMER`` as a system check error."""
    _specs, problems = read_settings()
    return [Error(problem.message, hint=HINTS.get(problem.id), id=problem.id) for problem in problems]


def check_view_models(app_configs: Optional[Sequence[AppConfig]] = None, **kwargs: Any) -> List[CheckMessage]:
    """Every batched view in the URLconf must name a model of
    ``STREAMER["MODELS"]`` (E010), and a level of it (E011). Walks the
    URLconf (loading it, as Django's own URL checks do); a URLconf that does
    not load is theirs to report."""
    from django.conf import settings
    from django.urls import get_resolver

    streamer = getattr(settings, "STREAMER", None)
    models = streamer.get("MODELS") if isinstance(streamer, dict) else None
    if not isinstance(models, dict) or not getattr(settings, "ROOT_URLCONF", None):
        return []  # E001 reports the first; no URLconf, no views
    try:
        patterns = list(get_resolver().url_patterns)
    except Exception:
        return []
    errors: List[CheckMessage] = []
    specs: Optional[Dict[str, ModelSpec]] = None  # read once, where a view has a priority
    for route, callback in _views(patterns, ""):
        name = getattr(callback, "streamer_model", None)
        if name is not None and name not in models:
            known = ", ".join(map(repr, models)) or "none"
            errors.append(
                Error(
                    f"the batched view at {route!r} serves the model {name!r}, which STREAMER['MODELS'] does not have "
                    f"(it has {known})",
                    hint=HINTS["django_streamer.E010"],
                    id="django_streamer.E010",
                )
            )
        priority = getattr(callback, "streamer_priority", None)
        if name is not None and priority is not None and priority.given:
            specs = specs if specs is not None else read_settings()[0]
            spec = specs.get(name)
            if spec is None:
                continue  # a model with wrong settings: their check reports it
            levels = setting_path("MODELS", name, "PRIORITY_LEVELS")
            problem = priority.problem(spec.config.priority_levels, f"the batched view at {route!r}", levels)
            if problem is not None:
                errors.append(Error(problem, hint=HINTS["django_streamer.E011"], id="django_streamer.E011"))
    return errors


def _views(patterns: Sequence[Any], prefix: str) -> Iterator[Tuple[str, Any]]:
    """``(route, view)`` for every view under ``patterns``, included ones too."""
    for pattern in patterns:
        route = prefix + str(pattern.pattern)
        if hasattr(pattern, "url_patterns"):
            yield from _views(pattern.url_patterns, route)
        else:
            yield route, pattern.callback
