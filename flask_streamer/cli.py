"""``flask streamer``: commands for the batched routes of an app.

flask --app example_flask streamer run-workers [--route NAME ...] [--workers N] [--devices 0,1]
flask --app example_flask streamer status [--json]

The group is a Flask plugin command (the ``flask.commands`` entry point), so
``flask`` finds it before it loads the app, and the commands load the app
themselves: a wrong setting is then said in one line per setting, with exit
status 2, not in a traceback of the app's factory.
"""

from __future__ import annotations

import sys
from typing import Any, List, NoReturn, Optional, Tuple

import click
from flask import Flask
from flask.cli import ScriptInfo

from streamer_core.backends.redis import run_worker_groups
from streamer_core.errors import ConfigurationError
from streamer_core.logs import show_logs
from streamer_core.web.spec import ModelSpec
from streamer_core.web.status import model_status, render_json, render_json_error, render_text

__all__ = ["streamer_cli"]

streamer_cli = click.Group("streamer", help="Workers and information for flask_streamer's batched routes.")


def _app(as_json: bool = False) -> Flask:
    """The app ``flask`` was told of (``--app``, ``FLASK_APP``), loaded
    here: a ConfigurationError from its set-up is said setting by setting
    (exit status 2), as ``python -m example_flask`` says it; ``as_json``:
    and as the status command's JSON on standard output."""
    ctx = click.get_current_context()
    try:
        app: Flask = ctx.ensure_object(ScriptInfo).load_app()
    except ConfigurationError as exc:
        _refuse(exc, as_json)
    return app


def _refuse(exc: ConfigurationError, as_json: bool) -> NoReturn:
    """Say a wrong setting line by line and exit with status 2; ``as_json``:
    and as the status command's JSON on standard output."""
    for message in exc.messages:
        click.echo(f"Error: {message}", err=True)
    if as_json:
        click.echo(render_json_error(exc.messages))
    click.get_current_context().exit(2)


def _routes(app: Flask, names: Tuple[str, ...]) -> List[Tuple[Any, ModelSpec]]:
    """The app's batched routes, or those named; a route serving another's
    model (``model="embed"``) is that route's model, counted once."""
    extension = app.extensions.get("streamer")
    if extension is None:
        raise click.UsageError("flask_streamer is not set up on this app: call FlaskStreamer(app) or init_app(app)")
    routes = extension.extension.routes(app)
    if names:
        known = {route.name: route for route in routes} | {route.endpoint: route for route in routes}
        missing = [name for name in names if name not in known]
        if missing:
            raise click.UsageError(
                f"no batched route named {', '.join(missing)}; "
                f"the app has {', '.join(r.name for r in routes) or 'none'}"
            )
        routes = list(dict.fromkeys(known[name] for name in names))
    if not routes:
        raise click.UsageError("the app has no batched routes: declare them with @streamer.batched_route")
    models = {id(extension.handles[route]): route for route in reversed(routes)}  # the first route of each model
    return [(route, extension.handles[route].spec) for route in routes if models[id(extension.handles[route])] is route]


@streamer_cli.command("status")
@click.option("--route", "names", multiple=True, metavar="NAME", help="Only this batched route; repeat for several.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of lines.")
def status(names: Tuple[str, ...], as_json: bool) -> None:
    """Each batched route's backend and batch settings and, for Redis, its
    live workers (host, pid, device, last beat), the requests waiting and
    pending and the oldest one's age. Exits 1 when a route cannot serve
    (Redis unreachable, no live worker), so it works as a health check."""
    app = _app(as_json)
    with app.app_context():
        try:
            routes = _routes(app, names)
        except click.UsageError as exc:
            if as_json:
                click.echo(render_json_error([exc.format_message()]))
            raise
        try:
            statuses = [model_status(spec, "flask streamer run-workers") for _route, spec in routes]
        except ConfigurationError as exc:  # Redis refused the URL's database number or password
            _refuse(exc, as_json)
    click.echo(render_json(statuses) if as_json else render_text(statuses, "run-workers"))
    sys.exit(0 if all(status.ok for status in statuses) else 1)


@streamer_cli.command("run-workers")
@click.option(
    "--route",
    "names",
    multiple=True,
    metavar="NAME",
    help="Only this batched route (its endpoint name); repeat for several. Default: every route.",
)
@click.option(
    "--workers",
    type=click.IntRange(min=1),
    default=None,
    help="Worker processes per route (default: STREAMER_WORKER_NUM or the route's worker_num).",
)
@click.option(
    "--devices",
    default=None,
    metavar="0,1",
    help="CUDA devices, comma-separated; worker i gets devices[i % n] (default: STREAMER_CUDA_DEVICES).",
)
@click.option(
    "--metrics-port",
    type=click.IntRange(min=0, max=65535),
    default=None,
    metavar="PORT",
    help="Serve the workers' Prometheus metrics on this port, at /metrics (needs prometheus_client).",
)
@click.option(
    "--log-level",
    default="INFO",
    show_default=True,
    type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"], case_sensitive=False),
)
def run_workers(
    names: Tuple[str, ...], workers: Optional[int], devices: Optional[str], metrics_port: Optional[int], log_level: str
) -> None:
    """Run the Redis workers of the app's batched routes until Ctrl-C or
    SIGTERM, which let every worker finish its batch in hand. A worker that
    dies is restarted. The web processes only enqueue."""
    app = _app()
    with app.app_context():
        specs = [spec for _route, spec in _routes(app, names)]
    not_redis = [spec.name for spec in specs if spec.backend != "redis"]
    if not_redis:
        raise click.UsageError(
            f"run-workers runs Redis workers, but {', '.join(not_redis)} use another backend: "
            "set STREAMER_BACKEND = 'redis' (and STREAMER_REDIS_URL), or pick routes with --route"
        )
    try:
        groups = [spec.worker_group(workers, devices) for spec in specs]
    except (TypeError, ValueError) as exc:
        raise click.BadParameter(str(exc), param_hint="--devices") from exc
    show_logs(log_level.upper())
    for spec, group in zip(specs, groups):
        click.echo(
            f"{spec.name}: {group.worker_num} worker(s) on {spec.redis.redacted} (keys streamer:{spec.prefix}:*)"
        )
    try:
        code = run_worker_groups(groups, metrics_port=metrics_port)
    except (TypeError, ValueError) as exc:
        raise click.UsageError(str(exc)) from exc
    sys.exit(code)
