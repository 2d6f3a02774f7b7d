"""django_streamer: dynamic batching for Django projects.

Add ``"django_streamer"`` to ``INSTALLED_APPS`` and describe the models in
``settings.STREAMER`` (see :mod:`django_streamer.conf`); ``manage.py check``
reports a wrong setting (ids in :mod:`django_streamer.checks`). Then::

    from django_streamer import get_streamer, batched_view, request_item

    vectors = get_streamer("embed").predict(["a sentence"])   # from any view

    @batched_view("embed")                                     # parse -> batch -> JSON
    def stream(request):
        return request_item(request, "s")

The thread and process backends start in each web process on first use and
stop at exit; the Redis workers run with ``manage.py run_gpu_workers``.
Nothing starts at import or in ``AppConfig.ready()``. For operations,
``path("", include("django_streamer.urls"))`` serves ``metrics``,
``healthz`` and ``readyz``, and ``manage.py streamer_status`` reports each
model's state.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any, Dict

from streamer_core.errors import ConfigurationError, InvalidInput

if TYPE_CHECKING:
    from .registry import (
        aget_streamer,
        close_streamers,
        drain,
        get_spec,
        get_streamer,
        model_names,
        start_streamers,
        started_models,
    )
    from .views import (
        AsyncBatchedView,
        BatchedView,
        batched_view,
        json_body,
        json_error,
        request_inputs,
        request_item,
        request_upload,
    )

__all__ = [
    "get_streamer",
    "aget_streamer",
    "get_spec",
    "model_names",
    "start_streamers",
    "started_models",
    "close_streamers",
    "drain",
    "batched_view",
    "BatchedView",
    "AsyncBatchedView",
    "request_item",
    "request_inputs",
    "request_upload",
    "json_body",
    "json_error",
    "InvalidInput",
    "ConfigurationError",
]

# The public names, by the module that holds them: imported on first use.
# Importing this package imports nothing of Django, so that a gunicorn
# config importing django_streamer.gunicorn loads no Django settings in the
# master (gevent's patching in a worker would touch them before the
# project's wsgi.py names its settings module).
_REGISTRY = ("get_streamer", "aget_streamer", "get_spec", "model_names", "start_streamers", "started_models")
_VIEWS = (
    "batched_view",
    "BatchedView",
    "AsyncBatchedView",
    "request_item",
    "request_inputs",
    "request_upload",
    "json_body",
    "json_error",
)
_WHERE: Dict[str, str] = {
    **dict.fromkeys((*_REGISTRY, "close_streamers", "drain"), "registry"),
    **dict.fromkeys(_VIEWS, "views"),
}


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'django_streamer' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value
