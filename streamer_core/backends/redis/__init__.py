"""The Redis backend: web processes enqueue, model workers anywhere consume.

How a request and its answer move, for a prefix ``P`` (keys under ``streamer:P``)::

    web process (RedisStreamer, client.py)   Redis                        worker (RedisWorker, worker.py)
    --------------------------------------   -----                        -------------------------------
    submit(batch): encode each input
      (large arrays out of band: codec.py)
    dispatcher: XADD one entry per input ->  P:requests  (a stream;  ->  reader: XREADGROUP the next batch
      with a random request id, all at       consumer group               while the model runs the current
      once (a script), once callers just     "workers")                   one; parse (wire.py), decode
      answered are back
                                                                         main: take the batch when the
                                                                           hold rule says so; run the model
    collector: XREAD from its last id,   <-  P:results:<client>      <-  writer: MULTI: XADD one entry per
      hand each answer to its call, a        (a stream per web            web process with all its answers,
      worker's batch at a time; trim         process)                     XACK and XDEL the requests; EXEC
      what was read

    With priority levels, level 1 is P:requests and level n is P:requests:n;
    web processes add each input to its level's stream, workers read the
    highest level's first (reader.py).
    Anything that does not parse goes to P:dead (capped), logged once.
    Workers beat into P:workers (a sorted set) so web processes know
    whether any is alive.

The reader holds at most one batch beyond the one running (the only
worker alive, shaping by cost, up to two full batches' worth with the
running one); a busy worker reads ahead only a full batch, so callers
reach a free worker first. A
worker's heartbeat (XCLAIM ... JUSTID) keeps what it holds from going idle;
entries idle longer than ``claim_after`` belong to a worker that died and
are XAUTOCLAIMed by another, which runs them one at a time (and fails one
that has already been in ``max_item_crashes`` dead workers' hands). Results
go to a stream, not PUBLISH: a web process that loses its connection reads
on from its last id when it is back. When the Redis server restarts empty,
each web process sends again what it has not been answered for, and
workers recreate the consumer group.

The modules, in the order data meets them: :mod:`.connection` (addresses,
errors), :mod:`.wire` (every key and field, and what is done with entries
that do not parse), :mod:`.client` (the web side: :mod:`.sender` puts
requests in, :mod:`.collector` reads answers back), :mod:`.worker` (the
worker) with :mod:`.model_loop` (its main thread), :mod:`.reader` (its
reader), :mod:`.intake` (entries to inputs, requests held, taken over),
:mod:`.ledger` (what a web process sent and waits for), :mod:`.answers`
(the writer) and :mod:`.presence` (the heartbeat, hangs),
:mod:`.supervisor` (running several workers).

Nothing read from Redis is unpickled unless both sides chose ``codec="pickle"``:
see :mod:`streamer_core.codec`.
"""

from .connection import connect, wait_for_broker
from .streamer import RedisStreamer
from .supervisor import WorkerGroup, run_redis_workers_forever, run_worker_groups
from .wire import Keys
from .worker import RedisWorker

__all__ = [
    "RedisStreamer",
    "RedisWorker",
    "run_redis_workers_forever",
    "run_worker_groups",
    "WorkerGroup",
    "wait_for_broker",
    "connect",
    "Keys",
]
