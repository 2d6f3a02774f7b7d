"""service_streamer 0.1.2's Redis workers of the examples' model, for
``bench/scale_bench.py``'s ``ss-redis``: what its README runs beside its
``RedisStreamer``.

    python -m bench.apps.ss_workers HOST:PORT PREFIX WORKERS [DEVICES]
"""

from __future__ import annotations

import sys

from service_streamer import run_redis_workers_forever  # type: ignore[import-untyped]

from bench.apps.cost_models import LegacyListEmbedder
from bench.apps.web_apps import BATCH_SIZE, MAX_LATENCY


def main(argv: list) -> int:
    broker, prefix, workers = argv[0], argv[1], int(argv[2])
    devices = [int(d) for d in argv[3].split(",")] if len(argv) > 3 and argv[3] else None
    run_redis_workers_forever(
        LegacyListEmbedder, BATCH_SIZE, MAX_LATENCY, worker_num=workers, cuda_devices=devices,
        redis_broker=broker, prefix=prefix,
    )  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
