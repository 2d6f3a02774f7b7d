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

__all__ = ["main"]


def _devices(text: str) -> List[Any]:
    return [int(d) if d.strip().isdigit() else d.strip() for d in text.split(",") if d.strip()]


def _json(kind: type) -> Callable[[str], Any]:
    def parse(text: str) -> Any:
        value = json.loads(text)
        if not isinstance(value, kind):
            raise argparse.ArgumentTypeError(f"expected a JSON {kind.__name__}, got {text!r}")
        return value

    return parse


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="streamer-worker",
        description="Run Redis workers for a model named by import path: a ManagedModel subclass or a batch function.",
        epilog="example, with the model of the Flask and Django examples:\n"
        "  streamer-worker example_flask.embedding:SentenceEmbedder --workers 1 --prefix embed "
        "--redis redis://127.0.0.1:6379/0",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("model", help="the model, module:attribute: a ManagedModel subclass or a batch function")
    parser.add_argument(
        "--redis",
        default=os.environ.get("STREAMER_REDIS_URL", "redis://127.0.0.1:6379/0"),
        help="Redis URL or host:port (default: $STREAMER_REDIS_URL or redis://127.0.0.1:6379/0)",
    )
    parser.add_argument("--prefix", default="", help="keeps models apart on one Redis; the web side uses the same")
    parser.add_argument("--workers", type=int, default=1, help="worker processes (default 1)")
    parser.add_argument(
        "--devices", type=_devices, default=None, help="CUDA devices, e.g. 0,1: worker i gets devices[i %% n]"
    )
    parser.add_argument("--batch-size", type=int, default=64, help="most inputs per model call (default 64)")
    parser.add_argument(
        "--max-latency", type=float, default=0.1, help="seconds the oldest input may wait for companions (default 0.1)"
    )
    parser.add_argument("--init-args", type=_json(list), default=None, help="JSON list passed to init_model")
    parser.add_argument("--init-kwargs", type=_json(dict), default=None, help="JSON object passed to init_model")
    parser.add_argument(
        "--codec",
        default="msgpack",
        choices=["msgpack", "pickle"],
        help="wire format; pickle only with a trusted broker (default msgpack)",
    )
    parser.add_argument(
        "--max-batch-cost",
        type=float,
        default=None,
        help="the most one batch may cost, in the units of the web side's item_cost (default: no limit)",
    )
    parser.add_argument(
        "--batch-cost",
        default="max",
        choices=["max", "sum"],
        help="a batch's cost: its length times its costliest input (max, for padding models) or the sum",
    )
    parser.add_argument(
        "--item-cost",
        default=None,
        help="module:function giving an input's cost, for requests whose web side sent none",
    )
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
        return run_redis_workers_forever(
            model,
            args.batch_size,
            args.max_latency,
            worker_num=args.workers,
            cuda_devices=args.devices,
            redis_broker=args.redis,
            prefix=args.prefix,
            model_init_args=args.init_args,
            model_init_kwargs=args.init_kwargs,
            codec=args.codec,
            max_batch_cost=args.max_batch_cost,
            batch_cost=args.batch_cost,
            item_cost=import_target(args.item_cost) if args.item_cost else None,
            metrics_port=args.metrics_port,
        )
    except (ValueError, TypeError) as exc:
        print(f"streamer-worker: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
