"""``settings.STREAMER``: its keys, their defaults, and how they become
:class:`~streamer_core.web.spec.ModelSpec` objects.

::

    STREAMER = {
        "BACKEND": "redis",                          # a default for every model
        "REDIS_URL": "redis://127.0.0.1:6379/0",
        "PREFIX": "myproject",                       # names this project's Redis keys
        "MODELS": {
            "embed": {
                "MODEL": "myapp.ml.EmbeddingModel",  # a ManagedModel subclass or a batch function
                "BATCH_SIZE": 64, "MAX_LATENCY": 0.05,
                "WORKER_NUM": 2, "CUDA_DEVICES": [0, 1],
                "INIT_KWARGS": {},
            },
        },
    }

Every key but ``MODELS``, ``PREFIX``, ``MAX_BODY_BYTES`` and ``MAX_INPUTS``
may be given at the top level, as the default of every model, and in a
model's entry, for that model only. ``MAX_BODY_BYTES`` (default 10 MiB,
``None`` for no limit) is the largest request body a batched view reads: a
larger one is answered 413 before it is read. ``MAX_INPUTS`` (default 2048)
is the most inputs one request to a view that takes many (``many=True``)
carries: more is answered 413 before anything is queued.
``TIMEOUT_HEADER`` (default ``"X-Request-Timeout"``) names the request
header a client says its remaining wait in, seconds (``None``: none), and
``ENVOY_TIMEOUT`` (default ``False``) reads Envoy's
``x-envoy-expected-rq-timeout-ms`` too (:mod:`streamer_core.web.deadline`).
``ERROR_DETAILS`` (default ``None``: as ``DEBUG``) says whether a 500
tells the client its exception's type and message, or only ``internal
error`` and the id its log line carries. ``SHORTCUTS``
(default ``True``) is the project's switch of the shortcuts through
Django's, gevent's and gunicorn's private workings
(:mod:`streamer_core.shortcuts`): ``False`` takes their public paths.
``MODEL``, ``INIT_ARGS`` and ``INIT_KWARGS`` belong to a model's entry.
``ENVIRONMENT``, shaped as ``STREAMER`` itself, names the environment
variable a setting was read from (``{"BACKEND": "STREAMER_BACKEND",
"MODELS": {"embed": {"BATCH_SIZE": "STREAMER_BATCH_SIZE"}}}``): a problem
with that setting names the variable, where it is set, as the user wrote it.

Reading the settings never imports anything but the models named by
``MODEL`` and never starts anything: the system checks
(:mod:`django_streamer.checks`) call :func:`read_settings` and report what it
finds; the views and ``run_gpu_workers`` call :func:`model_specs`, which
raises :class:`ImproperlyConfigured` with the same messages.
"""

from __future__ import annotations

import difflib
import os
from typing import Any, Dict, List, Mapping, NamedTuple, Optional, Tuple

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

from streamer_core.importing import import_target
from streamer_core.options.config import OPTIONS
from streamer_core.web.spec import MODEL_SETTINGS, ModelSpec

__all__ = [
    "DEFAULTS",
    "MODEL_KEYS",
    "TOP_LEVEL_KEYS",
    "DEFAULT_PREFIX",
    "SettingProblem",
    "read_settings",
    "model_specs",
    "setting_path",
    "written_as",
]

#: The Redis key prefix of a project that sets no ``PREFIX``: model ``name``
#: uses the keys ``streamer:django:name:*``.
DEFAULT_PREFIX = "django"

#: Each key a model takes from the top level when its entry does not set it,
#: with its default; the value is the option it gives (each option, its
#: default and its check are defined in :data:`streamer_core.options.config.OPTIONS`).
DEFAULTS: Dict[str, Tuple[str, Any]] = {
    name.upper(): (name, OPTIONS[name].default) for name in MODEL_SETTINGS if name != "prefix"
}

#: Keys only a model's own entry may hold.
MODEL_ONLY: Dict[str, str] = {"MODEL": "model", "INIT_ARGS": "init_args", "INIT_KWARGS": "init_kwargs"}

#: Every key of a model's entry.
MODEL_KEYS = tuple(DEFAULTS) + tuple(MODEL_ONLY)

#: Every key of ``STREAMER`` itself.
#: The keys of the views' requests, top level only.
REQUEST_KEYS = ("MAX_BODY_BYTES", "MAX_INPUTS", "TIMEOUT_HEADER", "ENVOY_TIMEOUT", "ERROR_DETAILS", "SHORTCUTS")
TOP_LEVEL_KEYS = ("MODELS", "PREFIX", "ENVIRONMENT", *REQUEST_KEYS) + tuple(DEFAULTS)


class SettingProblem(NamedTuple):
    """One wrong setting: its check id (``django_streamer.E00n``, see
    :mod:`django_streamer.checks`) and a message naming the setting."""

    id: str
    message: str


#: ModelSpec's problem kinds, as check ids.
KIND_IDS = {
    "backend": "django_streamer.E002",
    "model": "django_streamer.E003",
    "size": "django_streamer.E004",
    "seconds": "django_streamer.E005",
    "devices": "django_streamer.E006",
    "redis_url": "django_streamer.E007",
    "option": "django_streamer.E009",
}


def setting_path(*keys: str) -> str:
    """``STREAMER["MODELS"]["embed"]["BATCH_SIZE"]`` for ``("MODELS", "embed", "BATCH_SIZE")``."""
    return "STREAMER" + "".join(f"[{key!r}]" for key in keys)


def written_as(streamer: Mapping[str, Any], *keys: str) -> str:
    """The setting at ``keys`` as a problem names it: the environment
    variable ``STREAMER["ENVIRONMENT"]`` says it was read from, where that
    variable is set (what the user wrote, as Flask names its
    ``FLASK_STREAMER_*`` variables), and its path; else its path."""
    variable: Any = streamer.get("ENVIRONMENT")
    for key in keys:
        variable = variable.get(key) if isinstance(variable, Mapping) else None
    if isinstance(variable, str) and variable in os.environ:
        return f"{variable} in the environment ({setting_path(*keys)})"
    return setting_path(*keys)


class _Unset:
    def __repr__(self) -> str:
        return "<unset>"


_UNSET: Any = _Unset()


def read_settings(streamer: Any = _UNSET) -> Tuple[Dict[str, ModelSpec], List[SettingProblem]]:
    """The models of ``streamer`` (default: ``settings.STREAMER``) as specs,
    and every problem found. A model with problems has no spec. Imports each
    ``MODEL`` given as a path; starts nothing."""
    if streamer is _UNSET:
        streamer = getattr(settings, "STREAMER", _UNSET)
    problems: List[SettingProblem] = []
    if streamer is _UNSET:
        problems.append(
            SettingProblem(
                "django_streamer.E001", "settings.STREAMER is not set, but django_streamer is in INSTALLED_APPS"
            )
        )
        return {}, problems
    if not isinstance(streamer, Mapping):
        problems.append(SettingProblem("django_streamer.E001", f"settings.STREAMER must be a dict, got {streamer!r}"))
        return {}, problems
    problems.extend(_unknown_keys(streamer, TOP_LEVEL_KEYS, ()))
    problems.extend(_environment_problems(streamer.get("ENVIRONMENT", {}), ("ENVIRONMENT",)))
    prefix = streamer.get("PREFIX", DEFAULT_PREFIX)
    if not isinstance(prefix, str) or not prefix:
        problems.append(
            SettingProblem(
                "django_streamer.E009",
                f"{written_as(streamer, 'PREFIX')} must be a non-empty string, got {prefix!r}",
            )
        )
        prefix = DEFAULT_PREFIX
    for key in REQUEST_KEYS:
        option = OPTIONS[key.lower()]
        try:
            option.checked(streamer.get(key, option.default), written_as(streamer, key))
        except (TypeError, ValueError) as exc:
            problems.append(SettingProblem("django_streamer.E009", str(exc)))
    models = streamer.get("MODELS", _UNSET)
    if not isinstance(models, Mapping) or not models:
        got = "it is not set" if models is _UNSET else f"got {models!r}"
        problems.append(
            SettingProblem(
                "django_streamer.E001",
                f"{setting_path('MODELS')} must be a dict of at least one model, name to settings; {got}",
            )
        )
        return {}, problems
    specs: Dict[str, ModelSpec] = {}
    for name, entry in models.items():
        spec, found = _read_model(streamer, prefix, name, entry)
        problems.extend(found)
        if spec is not None and not found:
            specs[name] = spec
    return specs, list(dict.fromkeys(problems))  # a bad top-level default is reported once, not per model


def max_inputs() -> int:
    """``STREAMER["MAX_INPUTS"]``: the most inputs one request to a view that
    takes many carries (checked by :func:`read_settings`)."""
    streamer = getattr(settings, "STREAMER", None)
    option = OPTIONS["max_inputs"]
    value = streamer.get("MAX_INPUTS", option.default) if isinstance(streamer, Mapping) else option.default
    try:
        most: int = option.checked(value)
    except (TypeError, ValueError):
        most = option.default  # a wrong one is a system check error
    return most


def _request_option(key: str) -> Any:
    """The top-level key ``key`` of ``STREAMER`` (one of :data:`REQUEST_KEYS`),
    checked, or its default where it is not set or wrong (a wrong one is a
    system check error)."""
    streamer = getattr(settings, "STREAMER", None)
    option = OPTIONS[key.lower()]
    value = streamer.get(key, option.default) if isinstance(streamer, Mapping) else option.default
    try:
        return option.checked(value)
    except (TypeError, ValueError):
        return option.default


def timeout_header() -> Optional[str]:
    """``STREAMER["TIMEOUT_HEADER"]``: the request header a client says its
    remaining wait in (seconds); ``None``: none is read."""
    header: Optional[str] = _request_option("TIMEOUT_HEADER")
    return header


def envoy_timeout() -> bool:
    """``STREAMER["ENVOY_TIMEOUT"]``: whether Envoy's
    ``x-envoy-expected-rq-timeout-ms`` is read as the client's deadline too."""
    return bool(_request_option("ENVOY_TIMEOUT"))


def error_details() -> Optional[bool]:
    """``STREAMER["ERROR_DETAILS"]``: whether a 500 says its exception's type
    and message; ``None`` (the default): as ``DEBUG`` says."""
    streamer = getattr(settings, "STREAMER", None)
    option = OPTIONS["error_details"]
    value = streamer.get("ERROR_DETAILS", option.default) if isinstance(streamer, Mapping) else option.default
    try:
        details: Optional[bool] = option.checked(value)
    except (TypeError, ValueError):
        details = False  # a wrong one is a system check error; say nothing meanwhile
    return details


def shortcuts() -> bool:
    """``STREAMER["SHORTCUTS"]``: whether the project's shortcuts through
    other packages' workings may be taken (checked by :func:`read_settings`)."""
    streamer = getattr(settings, "STREAMER", None)
    option = OPTIONS["shortcuts"]
    value = streamer.get("SHORTCUTS", option.default) if isinstance(streamer, Mapping) else option.default
    try:
        on: bool = option.checked(value)
    except (TypeError, ValueError):
        on = option.default  # a wrong one is a system check error
    return on


def max_body_bytes() -> Optional[int]:
    """``STREAMER["MAX_BODY_BYTES"]``: the largest request body a batched view
    reads (checked by :func:`read_settings`)."""
    streamer = getattr(settings, "STREAMER", None)
    option = OPTIONS["max_body_bytes"]
    value = streamer.get("MAX_BODY_BYTES", option.default) if isinstance(streamer, Mapping) else None
    try:
        limit: Optional[int] = option.checked(value)
    except (TypeError, ValueError):
        return None  # a wrong one is a system check error
    return limit


def model_specs() -> Dict[str, ModelSpec]:
    """Every model of ``settings.STREAMER``, by name. Raises
    :class:`ImproperlyConfigured` listing every problem (what
    ``manage.py check`` reports) when there is any."""
    specs, problems = read_settings()
    if problems:
        lines = "\n  ".join(f"({problem.id}) {problem.message}" for problem in problems)
        raise ImproperlyConfigured(f"bad settings.STREAMER (run `manage.py check` for hints):\n  {lines}")
    return specs


def _read_model(
    streamer: Mapping[str, Any], prefix: str, name: Any, entry: Any
) -> Tuple[Optional[ModelSpec], List[SettingProblem]]:
    if not isinstance(name, str) or not name or ":" in name:
        return None, [
            SettingProblem(
                "django_streamer.E001",
                f"{setting_path('MODELS')} has the key {name!r}: name each model with a non-empty string without ':'",
            )
        ]
    if not isinstance(entry, Mapping):
        return None, [
            SettingProblem(
                "django_streamer.E001",
                f"{setting_path('MODELS', name)} must be a dict such as {{'MODEL': 'myapp.ml.Model'}}, got {entry!r}",
            )
        ]
    problems = list(_unknown_keys(entry, MODEL_KEYS, ("MODELS", name)))
    if "MODEL" not in entry:
        problems.append(
            SettingProblem(
                "django_streamer.E003",
                f"{setting_path('MODELS', name, 'MODEL')} is not set: give the import path of a ManagedModel "
                "subclass or of a batch function, e.g. 'myapp.ml.EmbeddingModel'",
            )
        )
        model: Any = _placeholder
    else:
        model, problem = _import_model(entry["MODEL"], written_as(streamer, "MODELS", name, "MODEL"))
        if problem is not None:
            problems.append(problem)
            model = _placeholder

    values: Dict[str, Any] = {}
    where: Dict[str, str] = {"model": written_as(streamer, "MODELS", name, "MODEL")}
    for key, (field, default) in DEFAULTS.items():
        if key in entry:
            values[field], where[field] = entry[key], written_as(streamer, "MODELS", name, key)
        else:
            values[field], where[field] = streamer.get(key, default), written_as(streamer, key)
    for key in ("INIT_ARGS", "INIT_KWARGS"):
        field = MODEL_ONLY[key]
        where[field] = setting_path("MODELS", name, key)
        if key in entry:
            values[field] = entry[key]
    values["prefix"] = f"{prefix}:{name}"
    spec, found = ModelSpec.from_settings(name, model, values, lambda field: where.get(field, field))
    problems.extend(SettingProblem(KIND_IDS.get(p.kind, "django_streamer.E009"), p.message) for p in found)
    return spec, problems


def _import_model(value: Any, path: str) -> Tuple[Any, Optional[SettingProblem]]:
    """``MODEL`` as an object: an import path is imported, an object is taken as it is."""
    if not isinstance(value, str):
        return value, None  # ModelSpec.from_settings says whether it is a model
    try:
        return import_target(value), None
    except ValueError as exc:
        return None, SettingProblem("django_streamer.E003", f"{path} is {value!r}, which does not import: {exc}")
    except Exception as exc:  # the module itself raised while importing
        return None, SettingProblem(
            "django_streamer.E003",
            f"{path} is {value!r}, whose module raised {type(exc).__name__} while importing: {exc}",
        )


def _unknown_keys(given: Mapping[str, Any], known: Tuple[str, ...], where: Tuple[str, ...]) -> List[SettingProblem]:
    found = []
    for key in given:
        if key in known:
            continue
        close = difflib.get_close_matches(str(key), known, n=1) if isinstance(key, str) else []
        advice = f"did you mean {close[0]!r}?" if close else f"the keys are {', '.join(known)}"
        if where == () and key in MODEL_ONLY:
            advice = f"{key} belongs in each model's entry, {setting_path('MODELS', '<name>', key)}"
        if where != () and key in ("PREFIX", *REQUEST_KEYS):
            advice = f"{key} is set once for every model, at the top level: {setting_path(key)}"
        found.append(
            SettingProblem(
                "django_streamer.E008",
                f"{setting_path(*where) if where else 'STREAMER'} has the unknown key {key!r}: {advice}",
            )
        )
    return found


def _environment_problems(given: Any, where: Tuple[str, ...]) -> List[SettingProblem]:
    """``STREAMER["ENVIRONMENT"]`` must be a dict whose values are variable
    names or dicts of the same kind (a model's entry under ``MODELS``)."""
    if isinstance(given, Mapping):
        found = []
        for key, value in given.items():
            if not isinstance(value, str):
                found.extend(_environment_problems(value, (*where, str(key))))
        return found
    return [
        SettingProblem(
            "django_streamer.E001",
            f"{setting_path(*where)} must be a dict of setting names to the environment variables they were read "
            f"from (shaped as STREAMER), got {given!r}",
        )
    ]


def _placeholder(batch: Any) -> Any:  # stands for a model that could not be imported, to check the rest
    return batch
