"""``manage.py run_gpu_workers``: run the Redis workers of ``STREAMER["MODELS"]``.

    manage.py run_gpu_workers                          # every model
    manage.py run_gpu_workers --model embed --workers 2 --devices 0,1

The web processes only enqueue (``BACKEND = "redis"``); these workers load
the models and run the batches. A worker that dies is restarted; SIGTERM or
Ctrl-C lets every worker finish the batch in hand, then the command exits 0.
While Redis does not answer, the command says so in one log line (repeated
every 30 seconds) and keeps trying.
"""

from __future__ import annotations

import argparse
import logging
from typing import Any, Dict, List, Optional, Tuple

from django.core.exceptions import ImproperlyConfigured
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import connections

from streamer_core.backends.redis import run_worker_groups
from streamer_core.logs import show_logs
from streamer_core.options.config import OPTIONS
from streamer_core.web.spec import ModelSpec

from ...conf import model_specs

#: ``-v``/``--verbosity`` to the log level of the command and its workers.
LOG_LEVELS = {0: logging.WARNING, 1: logging.INFO, 2: logging.DEBUG, 3: logging.DEBUG}


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 1, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 1, got {value}")
    return value


class Command(BaseCommand):
    help = (
        "Run the Redis workers of the models in settings.STREAMER['MODELS'] until SIGTERM or Ctrl-C, "
        "which let every worker finish its batch in hand. A worker that dies is restarted."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--model",
            action="append",
            dest="models",
            metavar="NAME",
            default=None,
            help="Only this model (a key of STREAMER['MODELS']); repeat for several. Default: all.",
        )
        parser.add_argument(
            "--workers",
            type=_positive_int,
            default=None,
            metavar="N",
            help="Worker processes per model, instead of its WORKER_NUM setting.",
        )
        parser.add_argument(
            "--devices",
            default=None,
            metavar="0,1",
            help="CUDA devices, comma-separated, instead of the CUDA_DEVICES setting: worker i gets devices[i %% n].",
        )
        parser.add_argument(
            "--metrics-port",
            type=int,
            default=None,
            metavar="PORT",
            help="Serve the workers' Prometheus metrics on this port, at /metrics (needs prometheus_client).",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        level = LOG_LEVELS.get(options["verbosity"], logging.DEBUG)
        show_logs(level)
        specs = self._selected(options["models"])
        devices = self._devices(options["devices"])
        groups = [spec.worker_group(options["workers"], devices) for spec in specs]
        for spec, group in zip(specs, groups):
            where = f" on device(s) {', '.join(map(str, group.devices))}" if group.devices else ""
            self.stdout.write(
                f"{spec.name}: {group.worker_num} worker(s){where}, Redis {spec.redis.redacted}, "
                f"keys streamer:{spec.prefix}:*"
            )
        self.stdout.flush()
        # The workers are spawned processes; a database connection opened by
        # checks or settings code must not be shared with (or held for) them.
        connections.close_all()
        try:
            code = run_worker_groups(groups, metrics_port=options["metrics_port"])
        except (TypeError, ValueError) as exc:
            raise CommandError(f"cannot start the workers: {exc}") from exc
        if code != 0:
            raise CommandError("every worker failed to load its model; see the log above", returncode=code)

    def _selected(self, names: Optional[List[str]]) -> List[ModelSpec]:
        try:
            specs: Dict[str, ModelSpec] = model_specs()
        except ImproperlyConfigured as exc:
            raise CommandError(str(exc)) from exc
        if names:
            missing = [name for name in names if name not in specs]
            if missing:
                raise CommandError(
                    f"no model named {', '.join(map(repr, missing))} in STREAMER['MODELS']; "
                    f"the models are {', '.join(map(repr, specs))}"
                )
            chosen = [specs[name] for name in dict.fromkeys(names)]
        else:
            chosen = list(specs.values())
        not_redis = [f"{spec.name!r} ({spec.backend})" for spec in chosen if spec.backend != "redis"]
        if not_redis:
            raise CommandError(
                f"run_gpu_workers runs Redis workers, but the model(s) {', '.join(not_redis)} use another backend, "
                "whose workers each web process starts itself: set STREAMER['BACKEND'] = 'redis' and "
                "STREAMER['REDIS_URL'], or choose models with --model"
            )
        return chosen

    def _devices(self, text: Optional[str]) -> Optional[Tuple[Any, ...]]:
        if text is None:
            return None
        try:
            devices: Tuple[Any, ...] = OPTIONS["cuda_devices"].checked(text, "--devices")
        except (TypeError, ValueError) as exc:
            raise CommandError(f"{exc} (got {text!r})") from None
        return devices
