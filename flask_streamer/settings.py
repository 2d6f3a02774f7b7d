"""The ``STREAMER_*`` settings in ``app.config``, their defaults and checks.

=================================  ==============  ==============================================
setting                            default         meaning
=================================  ==============  ==============================================
``STREAMER_BACKEND``               ``"thread"``    ``"thread"``, ``"process"`` or ``"redis"``
``STREAMER_BATCH_SIZE``            ``64``          the most inputs in one model call
``STREAMER_MAX_LATENCY``           ``0.1``         seconds the oldest input may wait for companions
``STREAMER_WORKER_NUM``            ``1``           worker processes per route (process, redis)
``STREAMER_MODEL_THREADS``         ``1``           batches run at once on the thread backend (one model)
``STREAMER_CUDA_DEVICES``          ``None``        e.g. ``[0, 1]`` or ``"0,1"``: worker i gets devices[i % n]
``STREAMER_REDIS_URL``             ``None``        e.g. ``"redis://127.0.0.1:6379/0"``; required for redis
``STREAMER_PREFIX``                ``app.name``    names this app's Redis keys (web and workers agree)
``STREAMER_TIMEOUT``               ``20.0``        seconds a request may wait for its result (then 504)
``STREAMER_MAX_QUEUE``             ``None``        inputs queued per route before 503; None: no limit
``STREAMER_CODEC``                 ``"msgpack"``   Redis wire format; ``"pickle"`` only with a trusted broker
``STREAMER_ITEM_COST``             ``None``        a function of one input (or its import path) giving its cost
``STREAMER_MAX_BATCH_COST``        ``None``        the most one batch may cost; None: no limit but the size
``STREAMER_BATCH_COST``            ``"max"``       ``"max"``: length times the costliest input; ``"sum"``
``STREAMER_TRACING``               ``False``       OpenTelemetry spans of each request and batch (the otel extra)
``STREAMER_PRIORITY_LEVELS``       ``1``           how many priority levels, 1 the highest; 1: off
``STREAMER_DEFAULT_PRIORITY``      ``None``        the level of a call naming none; None: the lowest
``STREAMER_PRIORITY_AGING``        ``None``        seconds of waiting that serve an input one level higher
``STREAMER_PRIORITY_MAX_QUEUE``    ``None``        a bound per level (1 first); None: MAX_QUEUE for each
``STREAMER_PRIORITY_TIMEOUT``      ``None``        a default timeout per level (1 first); None: TIMEOUT
``STREAMER_OVERLOAD_AFTER``        ``0.5``         seconds a queue callers leave stands before it goes newest first
``STREAMER_OVERLOAD_WAIT``         ``2.0``         under overload, seconds an input waits before its call gets 503
``STREAMER_METRICS_ROUTE``         ``None``        e.g. ``"/metrics"``: Prometheus metrics (prometheus_client)
``STREAMER_HEALTH_ROUTE``          ``None``        e.g. ``"/healthz"``: liveness, 200 while the process serves
``STREAMER_READY_ROUTE``           ``None``        e.g. ``"/readyz"``: readiness, 200 when every route can serve
``STREAMER_MAX_BODY_BYTES``        ``10485760``    the largest body a batched route reads (10 MiB); then 413
``STREAMER_MAX_INPUTS``            ``2048``        the most inputs of one request to a ``many=True`` route; then 413
``STREAMER_TIMEOUT_HEADER``        ``"X-Request-Timeout"`` the header a client says its remaining wait in (seconds)
``STREAMER_ENVOY_TIMEOUT``         ``False``       also read Envoy's ``x-envoy-expected-rq-timeout-ms``
``STREAMER_JSON_ERRORS``           ``False``       every HTTP error of the app (404, 405, 413...) answered as JSON
``STREAMER_ERROR_DETAILS``         ``None``        a 500 says its exception; None: only when ``app.debug``
``STREAMER_SHORTCUTS``             ``True``        shortcuts through Flask's, gevent's... workings (tested releases)
=================================  ==============  ==============================================

Every route may override any of them but the three routes by the keyword of
the same name (``batch_size=8``, ``redis_url=...``, ``max_body_bytes=...``,
``max_inputs=...``).
The Redis keys of a route are ``streamer:<STREAMER_PREFIX>:<endpoint>:*``,
or ``streamer:<prefix>:*`` when the route sets ``prefix`` itself (to share a
queue with ``streamer-worker --prefix``).
"""

from __future__ import annotations

import difflib
import json
import os
from typing import TYPE_CHECKING, Any, Dict, List, Mapping, Optional

from streamer_core.errors import ConfigurationError
from streamer_core.options.config import OPTIONS
from streamer_core.telemetry.metrics import available as metrics_available
from streamer_core.web.spec import MODEL_SETTINGS, ModelSpec

if TYPE_CHECKING:
    from flask import Flask

__all__ = [
    "DEFAULTS",
    "APP_DEFAULTS",
    "APP_OPTIONS",
    "BODY_DEFAULTS",
    "ROUTE_OPTIONS",
    "read_settings",
    "app_routes",
    "setting_name",
    "check_ops_routes",
]

#: Each setting's default, by option (:data:`streamer_core.options.config.OPTIONS`,
#: where each is defined); ``prefix`` ``None`` stands for the app's name.
DEFAULTS: Dict[str, Any] = dict({name: OPTIONS[name].default for name in MODEL_SETTINGS}, prefix=None)

#: The settings a route may override (every one): a route's ``prefix`` is
#: used as it is, where the app's is followed by ``:<endpoint>``.
ROUTE_OPTIONS = MODEL_SETTINGS

#: Settings of the app as a whole: where it serves its metrics and probes
#: (``None``: not served).
APP_DEFAULTS: Dict[str, Any] = {"metrics_route": None, "health_route": None, "ready_route": None}
_ROUTE_EXAMPLES = {"metrics_route": "/metrics", "health_route": "/healthz", "ready_route": "/readyz"}

#: What the web layer reads of a request, for every batched route (a route's
#: keyword of the same name overrides it).
BODY_DEFAULTS: Dict[str, Any] = {name: OPTIONS[name].default for name in ("max_body_bytes", "max_inputs")}
#: The app-wide options checked by the option table: how requests are read and errors answered.
APP_OPTIONS = (
    "max_body_bytes",
    "max_inputs",
    "timeout_header",
    "envoy_timeout",
    "json_errors",
    "error_details",
    "shortcuts",
)


def setting_name(field: str) -> str:
    return f"STREAMER_{field.upper()}"


def read_settings(config: Mapping[str, Any], app_name: str) -> Dict[str, Any]:
    """The app's settings, defaults filled in, checked: raises
    :class:`ConfigurationError` naming every wrong or unknown setting, as
    the user wrote it (``FLASK_STREAMER_BACKEND`` when it came from that
    environment variable through ``app.config.from_prefixed_env()``)."""
    fields = (*DEFAULTS, *APP_DEFAULTS, *APP_OPTIONS)
    known = {setting_name(field) for field in fields}
    settings = {field: config.get(setting_name(field), default) for field, default in DEFAULTS.items()}
    if settings["prefix"] is None:
        settings["prefix"] = app_name
    messages: List[str] = []
    for key in config:
        if key.startswith("STREAMER_") and key not in known:
            # Compare what follows STREAMER_, or every key would look close.
            close = difflib.get_close_matches(key[len("STREAMER_") :], [field.upper() for field in fields], n=1)
            written = written_as(key, config)
            if close:
                hint = f"; did you mean {written[: -len(key)]}STREAMER_{close[0]}?"
            else:
                hint = f"; the settings are {', '.join(sorted(known))}"
            messages.append(f"{written} is not a setting of flask_streamer{hint}")
    _spec, problems = ModelSpec.from_settings(
        "", _placeholder, settings, lambda field: written_as(setting_name(field), config)
    )
    messages.extend(problem.message for problem in problems)
    for field, rule in app_routes(config).items():
        if rule is not None and (not isinstance(rule, str) or not rule.startswith("/")):
            messages.append(
                f"{written_as(setting_name(field), config)} must be a URL path starting with '/' "
                f"(e.g. {_ROUTE_EXAMPLES[field]!r}) or None to serve none; got {rule!r}"
            )
    for field in APP_OPTIONS:
        try:
            value = config.get(setting_name(field), OPTIONS[field].default)
            OPTIONS[field].checked(value, written_as(setting_name(field), config))
        except (TypeError, ValueError) as exc:
            messages.append(str(exc))
    if config.get(setting_name("metrics_route")) is not None and not metrics_available():
        messages.append(
            f"{written_as(setting_name('metrics_route'), config)} serves Prometheus metrics, which need "
            "prometheus_client: pip install 'streamer-core[metrics]', or set it to None"
        )
    if messages:
        raise ConfigurationError("bad streamer settings:\n  " + "\n  ".join(messages), messages)
    return settings


def app_routes(config: Mapping[str, Any]) -> Dict[str, Optional[str]]:
    """``metrics_route``, ``health_route`` and ``ready_route``: each a path or
    ``None`` (checked by :func:`read_settings`); ``False`` is ``None`` too, as
    ``FLASK_STREAMER_METRICS_ROUTE=false`` means it."""
    routes = {field: config.get(setting_name(field), default) for field, default in APP_DEFAULTS.items()}
    return {field: None if rule is False else rule for field, rule in routes.items()}


def written_as(key: str, config: Mapping[str, Any]) -> str:
    """The name the user gave ``key``: ``FLASK_<key>`` when its value is that
    environment variable's, as ``app.config.from_prefixed_env()`` reads it
    (JSON, else the text), else ``key`` itself. A key not set at all, in an
    app whose streamer settings came from such variables, is named both
    ways: setting ``STREAMER_REDIS_URL`` in the environment would do nothing."""
    if key not in config:
        from_environment = any(_from_environment(other, config) for other in config if other.startswith("STREAMER_"))
        return f"{key} (FLASK_{key} in the environment)" if from_environment else key
    return f"FLASK_{key}" if _from_environment(key, config) else key


def _from_environment(key: str, config: Mapping[str, Any]) -> bool:
    """Whether ``config[key]`` is the value of the variable ``FLASK_<key>``."""
    text = os.environ.get(f"FLASK_{key}")
    if text is None:
        return False
    try:
        value = json.loads(text)
    except ValueError:
        value = text
    return bool(value == config[key])


def _placeholder(batch: Any) -> Any:  # stands for the route's model while checking app-wide settings
    return batch


def check_ops_routes(app: Flask, routes: Dict[str, str]) -> None:
    """Refuse operations routes (``STREAMER_METRICS_ROUTE`` and the probes')
    that share a path, or take one the app serves already to GET: either
    would hide one of the two without a word (werkzeug serves the first)."""
    problems: List[str] = []
    taken: Dict[str, str] = {}
    for field, rule in routes.items():
        name = written_as(setting_name(field), app.config)
        if rule in taken:
            problems.append(f"{name} and {taken[rule]} are both {rule!r}: give each a path of its own")
            continue
        taken[rule] = name
        served = [r.endpoint for r in app.url_map.iter_rules() if r.rule == rule and "GET" in (r.methods or ())]
        if served:
            problems.append(f"{name} is {rule!r}, which the app serves already ({served[0]!r}): choose another path")
    if problems:
        raise ConfigurationError("bad streamer settings:\n  " + "\n  ".join(problems), problems)
