"""How a web process puts requests in Redis, and takes back those of calls
that ended unanswered: :class:`RequestSender`, the sending half of
:class:`~.client.RedisClientBackend` (the reading half is :mod:`.collector`).

A batch of requests goes to each priority level's stream in one round trip:
a Lua script that unpacks them (msgpack in one argument, or plain arguments
on a server whose Lua lacks cmsgpack), or a pipeline of XADDs for inputs
with arrays, whose bytes go to the socket as they are. A blip (a lost
connection, Redis refusing writes) is retried with a doubling pause until
the call's time to be sent is up.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, List, Optional, Sequence, Tuple, cast

from ...batching.calls import Item
from ...codec import Buffers, Codec
from ...options.redis_address import RedisAddress
from ...telemetry.tracing import to_traceparent
from .connection import LoopErrors, OutageLog, broker_errors, broker_problem
from .damage import is_wrong_type, repair_key
from .ledger import Ledger
from .wire import (
    ADD_PACKED_REQUESTS_SCRIPT,
    ADD_REQUESTS_SCRIPT,
    Keys,
    by_level,
    packed_request_arguments,
    request_arguments,
    request_fields,
)

__all__ = ["RequestSender", "SEND_RETRY_S"]

logger = logging.getLogger("streamer_core.redis")

#: How long a web process tries to send a call to Redis, from the call's
#: arrival, before it fails with BrokerUnavailableError (seconds). The last
#: try may take longer: a connection to a host that does not answer is given
#: up after connect()'s socket_connect_timeout.
SEND_RETRY_S = 1.5
# The first pause between two tries of a send; each next one is twice as long.
_FIRST_RETRY_S = 0.1
#: A request to send: request id, timeout in ms, payload, buffers, cost, traceparent.
_Request = Tuple[bytes, int, bytes, Buffers, Optional[float], Optional[str]]


class RequestSender:
    """Sends one web process's requests on ``conn`` (its sending connection)
    and records each in ``ledger`` with its entry id; ``client_id`` names the
    process's results stream in every request."""

    def __init__(
        self, conn: Any, address: RedisAddress, keys: Keys, codec: Codec, client_id: str, ledger: Ledger
    ) -> None:
        self._conn = conn
        self._address = address
        self._keys = keys
        self._codec = codec
        self._client_id = client_id
        self._ledger = ledger
        self._add_requests = conn.register_script(ADD_REQUESTS_SCRIPT)
        self._add_packed = conn.register_script(ADD_PACKED_REQUESTS_SCRIPT)
        self._packed = True  # until the server's Lua turns out to lack cmsgpack
        namespace = keys.namespace
        self._outage = OutageLog(f"{namespace}: could not send to Redis", f"{namespace}: sending to Redis again")

    def send(self, entries: Sequence[Tuple[bytes, Item]], give_up_at: float) -> Optional[BaseException]:
        """XADD the entries, retrying through a blip (a lost connection, or
        Redis refusing writes: out of memory, a read-only replica) with a
        doubling pause, the last try at ``give_up_at`` (a ``time.monotonic()``
        value); ``None`` once sent, else the last error."""
        import redis

        failure: Optional[BaseException] = None
        pause = _FIRST_RETRY_S
        levels = sorted({item.level for _, item in entries})  # the highest first: each level to its stream
        while True:
            try:
                now = time.monotonic()
                while levels:
                    level = levels[0]
                    sent, requests, large = [], [], False
                    for request_id, item in entries:
                        future = item.task.future
                        if future is None or item.level != level:
                            continue
                        payload, buffers, cost = item.value
                        trace = None if item.task.trace is None else to_traceparent(item.task.trace)  # traced only
                        timeout_ms = max(1, int((future._deadline - now) * 1000))
                        requests.append((request_id, timeout_ms, payload, buffers, cost, trace))
                        sent.append(request_id)
                        large = large or bool(buffers)
                    self._ledger.added(sent, self._add(requests, large, level) if requests else [])
                    levels.pop(0)
                self._outage.succeeded()
                return None
            except broker_errors() as exc:
                failure = exc
                self._outage.failed(broker_problem(exc, self._address))
            except redis.ResponseError as exc:
                failure = exc
                if is_wrong_type(exc):
                    repair_key(self._conn, self._keys.request_stream(levels[0]), "stream")
                else:
                    self._outage.failed(broker_problem(exc, self._address))
            left = give_up_at - time.monotonic()
            if left <= 0:
                return failure
            time.sleep(min(pause, left))
            pause *= 2

    def _add(self, requests: Sequence[_Request], large: bool, level: int = 0) -> List[Any]:
        """Add one request entry each to the stream of priority ``level``,
        in one round trip; return their entry ids. ``requests``: request
        id, timeout in ms, payload, buffers, cost, traceparent."""
        import redis

        keys = [self._keys.request_stream(level)]
        if not large and self._packed:
            packed = [
                (request_id, timeout, payload, cost, trace) for request_id, timeout, payload, _, cost, trace in requests
            ]
            try:
                return cast(
                    List[Any],
                    self._add_packed(
                        keys, packed_request_arguments(self._client_id, self._codec.name, packed), self._conn
                    ),
                )
            except redis.ResponseError as exc:
                if "cmsgpack" not in str(exc):
                    raise
                logger.info("this Redis server's Lua has no cmsgpack: requests go in plain arguments")
                self._packed = False
        added = [
            request_fields(self._client_id, request_id, timeout_ms, self._codec.name, payload, buffers, cost, trace)
            for request_id, timeout_ms, payload, buffers, cost, trace in requests
        ]
        if large:
            # Arrays' bytes go to the socket as they are (see connection.py);
            # in a script Redis would copy them twice.
            pipe = self._conn.pipeline(transaction=False)
            for fields in added:
                pipe.xadd(keys[0], fields)
            return cast(List[Any], pipe.execute())
        return cast(List[Any], self._add_requests(keys, request_arguments(added), self._conn))

    def delete_abandoned(self, stopping: threading.Event) -> None:
        """Delete the requests of calls that ended other than by their
        answers (the caller gave up, a timeout, an error; see
        :meth:`Ledger.ended`), as soon as they end, so that a worker that has
        not read them never runs them (a thread of its own: the caller
        giving up must not wait on Redis); until ``stopping`` is set."""
        errors = LoopErrors("the Redis request deleter")
        abandon = self._ledger.abandon
        while not stopping.is_set():
            abandon.wait(0.5)
            abandon.clear()
            abandoned = self._ledger.take_abandoned()
            if abandoned:
                try:
                    pipe = self._conn.pipeline(transaction=False)
                    for level, entry_ids in by_level(abandoned).items():
                        pipe.xdel(self._keys.request_stream(level), *entry_ids)
                    pipe.execute()
                except broker_errors():
                    pass  # gone with Redis, or workers skip them when their deadline passes
                except Exception as exc:  # e.g. the key holds another type: workers skip them too
                    errors.log(exc)
