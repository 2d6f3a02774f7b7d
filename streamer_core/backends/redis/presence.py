"""A Redis worker's presence: its heartbeat, and knowing when its model hung.

Every beat (:meth:`Presence.run`, a thread of its own) the worker tells the
web processes it is alive (``require_workers`` refuses calls while no worker
is), learns whether it is the only worker (then it reads ahead more), and
claims again the requests in its hands, so that no other worker takes them
over. A model that has run one batch for ``hang_timeout`` seconds while none
of its callers waits any more is taken for hung (:class:`ModelWatch`): the
worker stops beating, so its requests go to others, and under the
supervisor its process exits to be started again.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from typing import Any, Dict, Optional

from ...options.redis_address import RedisAddress
from ...threads import background
from .connection import connect, server_time_ms
from .intake import Hands
from .wire import BEAT_S, BEAT_SCRIPT, GROUP, LIVE_WORKERS_SCRIPT, PRESENCE_MS, PRESENCE_TTL_MS, Keys

__all__ = ["ModelWatch", "Loading", "Presence", "EXIT_HUNG", "EXIT_HUNG_AFTER_ANSWERS"]

logger = logging.getLogger("streamer_core.redis")

#: Exit codes of a worker process that ended itself because its model hung,
#: before it had answered any batch, or after: the supervisor starts it again,
#: with twice the hang_timeout it had, or twice the one it was given.
EXIT_HUNG = 4
EXIT_HUNG_AFTER_ANSWERS = 5


class ModelWatch:
    """What the model is doing, as the main thread tells it: since when it
    runs the batch in hand, until when that batch's last caller waits
    (monotonic seconds), and whether it has answered a batch yet."""

    __slots__ = ("since", "until", "answered")

    def __init__(self) -> None:
        self.since: Optional[float] = None
        self.until = 0.0
        self.answered = False

    def started(self, now: float, until: float) -> None:
        self.until, self.since = until, now

    def ended(self) -> None:
        self.since = None


class Loading:
    """While a worker loads its model (seconds, often more), it says so: it
    beats into the ``loading`` set and writes when it started, so web
    processes answer "the model is loading" (with a ``Retry-After``) rather
    than "no worker", readiness says why it waits, and the status commands
    show it. A context manager around the load; the beats run on a thread."""

    def __init__(self, address: RedisAddress, keys: Keys, consumer: str, info: Dict[str, Any]) -> None:
        self._address = address
        self._keys = keys
        self._consumer = consumer
        self._info = info
        self._done = threading.Event()
        self._thread = background(self._beat, "streamer-redis-loading")

    def __enter__(self) -> Loading:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self._done.set()
        self._thread.join(5.0)

    def _beat(self) -> None:
        conn = connect(self._address)
        try:
            info = None
            while True:
                try:
                    if info is None:
                        since_ms = int(server_time_ms(conn, self._keys.loading))
                        info = json.dumps(dict(self._info, loading_since=since_ms))
                    conn.eval(BEAT_SCRIPT, 1, self._keys.loading, self._consumer, PRESENCE_TTL_MS)
                    pipe = conn.pipeline(transaction=False)
                    pipe.hset(self._keys.worker_info, self._consumer, info)
                    pipe.pexpire(self._keys.worker_info, PRESENCE_TTL_MS)
                    pipe.execute(raise_on_error=False)
                except Exception as exc:  # Redis not up yet: the worker waits for it as it always did
                    logger.debug("loading beat failed: %s", exc)
                if self._done.wait(BEAT_S):
                    break
            try:
                conn.zrem(self._keys.loading, self._consumer)
            except Exception as exc:  # it drops out of the set by itself, PRESENCE_MS after its last beat
                logger.debug("could not leave the loading set: %s", exc)
        finally:
            conn.close()


class Presence:
    """The heartbeat of the worker ``consumer`` (``info``: its host, pid and
    device, for the status commands), for the requests in ``hands``."""

    def __init__(
        self,
        address: RedisAddress,
        keys: Keys,
        consumer: str,
        info: str,
        hands: Hands,
        watch: ModelWatch,
        claim_after: float,
        hang_timeout: Optional[float],
        stopping: threading.Event,
        exit_when_hung: bool,
        levels: int = 1,
    ) -> None:
        self._address = address
        self._keys = keys
        self._consumer = consumer
        self._info = info
        self._hands = hands
        self._watch = watch
        self._claim_after = claim_after
        self._hang_timeout = hang_timeout
        self._stopping = stopping
        self._exit_when_hung = exit_when_hung
        self._hung_logged = False
        self._streams = keys.request_streams(levels)  # one per priority level
        #: No other worker is alive: read ahead as requests come.
        self.sole_worker = False

    def run(self) -> None:
        """Keep the requests in hand from looking abandoned while the model
        runs; unless the model has hung (see :meth:`hung`). The first beat
        is the worker's own, before its reader starts (:meth:`beat`)."""
        conn = connect(self._address)
        while not self._stopping.wait(min(BEAT_S, self._claim_after / 3, (self._hang_timeout or BEAT_S) / 4)):
            if self.hung():
                continue  # neither alive to the web side nor keeping its requests: others take them over
            self.beat(conn)
            for level, in_hand in self._hands.ids().items():
                try:
                    conn.xclaim(self._keys.request_stream(level), GROUP, self._consumer, 0, in_hand, justid=True)
                except Exception as exc:  # a blip: the next beat tries again
                    logger.debug("heartbeat failed: %s", exc)
        conn.close()

    def hung(self) -> bool:
        """Whether the model has run the batch in hand for ``hang_timeout``
        seconds or more and none of its callers waits any more. A worker
        process of the supervisor then exits (and is started again)."""
        since, hang_timeout = self._watch.since, self._hang_timeout
        now = time.monotonic()
        if since is None or hang_timeout is None or now - since < hang_timeout or now < self._watch.until:
            self._hung_logged = False
            return False
        if not self._hung_logged:
            self._hung_logged = True
            logger.error(
                "worker %s has run one batch for %.0fs and every caller of it has given up: taken for hung, %s "
                "(hang_timeout=%gs; raise it if batches take that long)",
                self._consumer,
                now - since,
                "its process exits to be started again"
                if self._exit_when_hung
                else "it stops claiming its requests until the model returns",
                hang_timeout,
            )
        if self._exit_when_hung:
            os._exit(EXIT_HUNG_AFTER_ANSWERS if self._watch.answered else EXIT_HUNG)
        return True

    def beat(self, conn: Any) -> None:
        """Tell web processes this worker is alive (see ``require_workers``),
        and learn whether it is the only one."""
        try:
            conn.eval(BEAT_SCRIPT, 1, self._keys.workers, self._consumer, PRESENCE_TTL_MS)
            pipe = conn.pipeline(transaction=False)
            pipe.hset(self._keys.worker_info, self._consumer, self._info)
            pipe.pexpire(self._keys.worker_info, PRESENCE_TTL_MS)
            pipe.execute(raise_on_error=False)  # for the status command only: never worth failing a beat
            self.sole_worker = int(conn.eval(LIVE_WORKERS_SCRIPT, 1, self._keys.workers, PRESENCE_MS)) <= 1
        except Exception as exc:  # a blip: the next beat tries again
            logger.debug("presence beat failed: %s", exc)

    def leave(self, conn: Any) -> None:
        """Remove this worker from the group, unless requests are pending
        under its name, by Redis's own count (a read whose reply was lost in
        a blip leaves some this worker never saw): removing the consumer would
        drop them, while left pending, another worker takes them over."""
        try:
            conn.zrem(self._keys.workers, self._consumer)
            conn.hdel(self._keys.worker_info, self._consumer)
            for stream in self._streams:
                if not conn.xpending_range(stream, GROUP, "-", "+", 1, self._consumer):
                    conn.xgroup_delconsumer(stream, GROUP, self._consumer)
        except Exception as exc:  # the server may be gone; the next sweep removes us
            logger.debug("could not leave the group: %s", exc)
