"""streamer_core: dynamic batching for model-serving web services.

Callers submit single requests; the streamer queues them into mini-batches,
runs each batch on the model (on a thread, in spawned worker processes, or
in workers behind Redis),
and hands every caller its own result. A drop-in successor to
service_streamer: change ``from service_streamer import ...`` to
``from streamer_core import ...``.

    from . import ThreadedStreamer

    streamer = ThreadedStreamer(model.predict, batch_size=64, max_latency=0.1)
    outputs = streamer.predict(inputs)          # blocks; inputs may be batched with others'
    future = streamer.submit(inputs)            # or: a concurrent.futures.Future of the list
"""

from .backends.process import Streamer
from .backends.redis import RedisStreamer, RedisWorker, run_redis_workers_forever
from .backends.thread import ThreadedStreamer
from .errors import (
    BatchLengthError,
    BrokerUnavailableError,
    ConfigurationError,
    InvalidInput,
    ItemCostError,
    NoWorkerError,
    OverloadedError,
    QueueFullError,
    RemoteError,
    RemoteTraceback,
    SerializationError,
    StreamerClosedError,
    StreamerError,
    StreamerTimeoutError,
    UnavailableError,
    WorkerDiedError,
    WorkerStartError,
)
from .future import BatchFuture
from .managed_model import ManagedModel
from .options.config import BatchingConfig
from .streamer import BaseStreamer
from .telemetry import metrics as _metrics  # noqa: F401  (exports every model's numbers to Prometheus, if installed)

__version__ = "0.1.0"

__all__ = [
    "ThreadedStreamer",
    "Streamer",
    "RedisStreamer",
    "RedisWorker",
    "run_redis_workers_forever",
    "ManagedModel",
    "BaseStreamer",
    "BatchFuture",
    "BatchingConfig",
    "StreamerError",
    "ConfigurationError",
    "InvalidInput",
    "StreamerClosedError",
    "StreamerTimeoutError",
    "UnavailableError",
    "QueueFullError",
    "OverloadedError",
    "WorkerStartError",
    "BrokerUnavailableError",
    "NoWorkerError",
    "WorkerDiedError",
    "BatchLengthError",
    "SerializationError",
    "ItemCostError",
    "RemoteError",
    "RemoteTraceback",
]
