"""``manage.py streamer_status``: each model's backend, batch settings and,
for Redis, its live workers and queue; exits non-zero when a model cannot
serve, so it works as a container's health check.

    manage.py streamer_status                # every model of STREAMER["MODELS"]
    manage.py streamer_status --model embed --json
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional

from django.core.exceptions import ImproperlyConfigured
from django.core.management.base import BaseCommand, CommandError, CommandParser

from streamer_core.errors import ConfigurationError
from streamer_core.web.spec import ModelSpec
from streamer_core.web.status import model_status, render_json, render_json_error, render_text

from ...conf import model_specs


class Command(BaseCommand):
    help = (
        "Show each model's backend and batch settings and, for Redis, its live workers (host, pid, device, "
        "last beat), the requests waiting and pending, and the oldest one's age. Exits 1 when a model "
        "cannot serve (Redis unreachable, no live worker)."
    )
    requires_system_checks: Any = []  # a health check must answer even when a check would fail

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--model", action="append", dest="models", metavar="NAME", default=None, help="Only this model; repeat."
        )
        parser.add_argument("--json", action="store_true", help="Print one JSON object instead of lines.")

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            specs = self._specs(options["models"])
        except CommandError as exc:
            if options["json"]:  # a script reading the output reads JSON whatever happened
                self.stdout.write(render_json_error([line.strip() for line in str(exc).splitlines() if line.strip()]))
            raise
        names = options["models"] or list(specs)
        try:
            statuses = [model_status(specs[name], "manage.py run_gpu_workers") for name in dict.fromkeys(names)]
        except ConfigurationError as exc:  # Redis refused the URL's database number or password
            if options["json"]:
                self.stdout.write(render_json_error(exc.messages))
            raise CommandError(str(exc)) from exc
        self.stdout.write(render_json(statuses) if options["json"] else render_text(statuses, "run_gpu_workers"))
        if not all(status.ok for status in statuses):
            raise CommandError("a model cannot serve; see above", returncode=1)

    @staticmethod
    def _specs(names: Optional[List[str]]) -> Dict[str, ModelSpec]:
        """The models of ``STREAMER``, every name in ``names`` among them."""
        try:
            specs = model_specs()
        except ImproperlyConfigured as exc:
            raise CommandError(str(exc)) from exc
        missing = [name for name in names or () if name not in specs]
        if missing:
            raise CommandError(
                f"no model named {', '.join(map(repr, missing))} in STREAMER['MODELS']; "
                f"the models are {', '.join(map(repr, specs))}"
            )
        return specs
