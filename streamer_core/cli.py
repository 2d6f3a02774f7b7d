"""``streamer-worker``: run Redis workers for a model named by import path.

    streamer-worker myapp.ml:Embedder --workers 4 --devices 0,1 --redis redis://127.0.0.1:6379/0

SIGTERM or Ctrl-C lets every worker finish the batch in hand, then exits 0.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from typing import Any, Callable, List, Optional

from . import __version__
from .backends.redis import run_redis_workers_forever
from .importing import import_target
from .logs import LOG_FORMAT
from .options.config import OPTIONS
from .options.redis_address import ADDRESS_FORMS, DEFAULT_REDIS

__all__ = ["main"]


def _json(kind: type) -> Callable[[str], Any]:
    def parse(text: str) -> Any:
        value = json.loads(text)
        if not isinstance(value, kind):
            raise argparse.ArgumentTypeError(f"expected a JSON {kind.__name__}, got {text!r}")
        return value

    return parse


#: The options given by flag, each ``(flag, option, type, metavar)``: their
#: defaults, help and checks are the option table's
#: (:data:`~streamer_core.options.config.OPTIONS`).
OPTION_FLAGS = (
    ("--workers", "worker_num", int, "N"),
    ("--devices", "cuda_devices", str, "0,1"),
    ("--batch-size", "batch_size", int, "N"),
    ("--max-latency", "max_latency", float, "SECONDS"),
    ("--codec", "codec", str, "msgpack|pickle"),
    ("--max-batch-cost", "max_batch_cost", float, "COST"),
    ("--batch-cost", "batch_cost", str, "max|sum"),
    ("--item-cost", "item_cost", str, "MODULE:FUNCTION"),
    ("--priority-levels", "priority_levels", int, "N"),
    ("--priority-aging", "priority_aging", float, "SECONDS"),
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="streamer-worker",
        description="Run Redis workers for a model named by import path: a ManagedModel subclass or a batch function.",
        epilog="example, with the model of the Flask and Django examples:\n"
        "  streamer-worker example_models.embedding:SentenceEmbedder --workers 1 --prefix embed "
        "--redis redis://127.0.0.1:6379/0",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("model", help="the model, module:attribute: a ManagedModel subclass or a batch function")
    parser.add_argument(
        "--redis",
        default=os.environ.get("STREAMER_REDIS_URL", DEFAULT_REDIS),
        help=f"where Redis is: {ADDRESS_FORMS} (default: $STREAMER_REDIS_URL or {DEFAULT_REDIS})",
    )
    parser.add_argument("--prefix", default="", help="keeps models apart on one Redis; the web side uses the same")
    for flag, name, kind, metavar in OPTION_FLAGS:
        option = OPTIONS[name]
        shown = "none" if option.default is None else option.default
        help_text = f"{option.help} (default {shown})".replace("%", "%%")
        parser.add_argument(flag, dest=name, type=kind, default=option.default, metavar=metavar, help=help_text)
    parser.add_argument("--init-args", type=_json(list), default=None, help="JSON list passed to init_model")
    parser.add_argument("--init-kwargs", type=_json(dict), default=None, help="JSON object passed to init_model")
    parser.add_argument(
        "--metrics-port",
        type=int,
        default=None,
        help="serve the workers' Prometheus metrics on this port, at /metrics (needs prometheus_client)",
    )
    parser.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    return parser


def main(argv: Optional[List[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=args.log_level, format=LOG_FORMAT)
    sys.path.insert(0, os.getcwd())  # find the model's module from where the command runs, as flask and gunicorn do
    try:
        model = import_target(args.model)
        options = {name: OPTIONS[name].checked(getattr(args, name), flag) for flag, name, *_ in OPTION_FLAGS}
        address = OPTIONS["redis_url"].checked(args.redis, "--redis")
        return run_redis_workers_forever(
            model,
            options.pop("batch_size"),
            options.pop("max_latency"),
            worker_num=options.pop("worker_num"),
            cuda_devices=options.pop("cuda_devices"),
            redis_broker=address,
            prefix=args.prefix,
            model_init_args=args.init_args,
            model_init_kwargs=args.init_kwargs,
            metrics_port=args.metrics_port,
            **options,
        )
    except (ValueError, TypeError) as exc:
        print(f"streamer-worker: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
