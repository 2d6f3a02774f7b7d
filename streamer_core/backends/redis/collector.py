"""How a web process reads its answers from Redis: :class:`ResultCollector`,
the loop of :class:`~.client.RedisClientBackend`'s collector thread (the
sending half is :mod:`.sender`).

It reads the process's results stream from its last id and hands each
answer to its call, a worker's batch at a time, trimming what was read in
the same round trip as the next read. Once a second it also looks after
what reading alone would not see: the server being another one (a restart
or a failover: every unanswered request is sent again), the workers
(calls fail when none has been alive for long), and its stream's lifetime.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, Callable, List, Optional, Sequence, Tuple

from ...batching.calls import Item, deliver
from ...batching.scheduler import Scheduler
from ...codec import Codec
from ...options.redis_address import RedisAddress
from .answers import read_answer
from .connection import MAX_BACKOFF_S, LoopErrors, ServerIdentity, broker_errors, broker_problem
from .damage import DeadLetters, is_wrong_type, repair_key
from .ledger import Ledger
from .roster import NO_WORKER_S, Roster
from .sender import SEND_RETRY_S
from .wire import RESULTS_TTL_S, Keys, MalformedEntry, Result, next_id, parse_results

__all__ = ["ResultCollector", "BLOCK_MS"]

logger = logging.getLogger("streamer_core.redis")

# The longest a web process holds a worker's batch of answers while the
# callers of the batch it answered just before come back (seconds): see
# _let_callers_return. Long enough for 64 callers on a busy 2-core machine.
_STAGGER_S = 0.003
# How often a web process checks the server is the same one (a restart empties it), counts workers.
_CHECK_SERVER_S = 1.0
#: How long one read of the results stream blocks (ms): also how soon the collector sees it should stop.
BLOCK_MS = 500

#: Sends requests again, the last try at the given time.monotonic(): None once sent, else the error.
Send = Callable[[Sequence[Tuple[bytes, Item]], float], Optional[BaseException]]


class ResultCollector:
    """Reads one web process's answers on ``conn`` (its reading connection)
    from ``results_key``. ``server`` is the identity of the server the
    requests in ``ledger`` were sent to, ``send`` sends them again;
    :attr:`scheduler` is set as the backend starts (answers count there)."""

    def __init__(
        self,
        conn: Any,
        address: RedisAddress,
        keys: Keys,
        results_key: str,
        codecs: Tuple[Codec, Codec],
        roster: Roster,
        ledger: Ledger,
        dead: DeadLetters,
        server: ServerIdentity,
        send: Send,
        stopping: threading.Event,
    ) -> None:
        self._conn = conn
        self._address = address
        self._keys = keys
        self._results_key = results_key
        self._codec, self._errors_codec = codecs
        self._roster = roster
        self._ledger = ledger
        self._dead = dead
        self._server = server
        self._send = send
        self._stopping = stopping
        self.scheduler: Optional[Scheduler] = None

    def run(self) -> None:
        """Read answers as they come and hand them to their calls. The
        trimming of what was read (and any dead letters) rides in the same
        round trip as the next read, so answers wait on nothing else."""
        import redis

        last_id = b"0-0"
        next_check = 0.0
        failing_since: Optional[float] = None
        errors = LoopErrors("the Redis result collector")
        pipe = self._conn.pipeline(transaction=False)
        roster = self._roster
        while not self._stopping.is_set():
            try:
                now = time.monotonic()
                if now >= next_check:
                    next_check = now + _CHECK_SERVER_S
                    if self._server_restarted():
                        last_id = b"0-0"
                    pipe.expire(self._results_key, RESULTS_TTL_S)
                    if roster.watching:
                        roster.check(self._conn)  # the workers' batch sizes too
                        if roster.missing():
                            self._fail_waiting(roster.error)
                    else:
                        roster.live_batch_sizes(self._conn)
                pipe.xread({self._results_key: last_id}, count=1000, block=BLOCK_MS)
                replies = pipe.execute(raise_on_error=False)
                reply = replies[-1]
                if isinstance(reply, Exception):
                    raise reply
                if failing_since is not None:
                    away_s, failing_since = time.monotonic() - failing_since, None
                    logger.warning("%s: Redis is reachable again after %.1f s", self._keys.namespace, away_s)
                if reply:
                    entries = reply[0][1]
                    last_id = entries[-1][0]
                    self._on_results(entries, pipe)
                    pipe.xtrim(self._results_key, minid=next_id(last_id))  # everything read, that one too
            except broker_errors() as exc:
                pipe.reset()
                roster.unreachable()
                if failing_since is None:
                    failing_since = time.monotonic()
                    problem = broker_problem(exc, self._address)
                    logger.warning("%s: lost Redis: %s; reconnecting", self._keys.namespace, problem)
                next_check = 0.0
                self._stopping.wait(min(MAX_BACKOFF_S, 0.05 + (time.monotonic() - failing_since) / 4))
            except redis.ResponseError as exc:
                pipe.reset()
                if is_wrong_type(exc) and repair_key(self._conn, self._results_key, "stream"):
                    # What it held instead of our stream replaced any answers in it.
                    last_id = b"0-0"
                    self._send_again("its results stream was overwritten")
                    continue
                errors.log(exc)
                self._stopping.wait(0.1)
            except Exception as exc:
                pipe.reset()
                errors.log(exc)
                self._stopping.wait(0.1)

    def _on_results(self, entries: List[Tuple[Any, Any]], pipe: Any) -> None:
        """Hand each answer to its call; drop answers of calls no longer
        waiting; queue on ``pipe`` the move of entries that are not answers
        to the dead-letter stream. Each entry answers one batch of a worker."""
        batches: List[Tuple[List[Item], List[Result]]] = []
        ledger = self._ledger
        with ledger.lock:
            for entry_id, fields in entries:
                try:
                    parsed = parse_results(fields)
                except MalformedEntry as exc:
                    self._dead.add(pipe, self._results_key, entry_id, fields, str(exc))
                    continue
                items, answers = [], []
                for answer, item in zip(parsed, ledger.answered([answer.item_id for answer in parsed])):
                    if item is not None:  # else answered already (sent twice after a restart) or given up
                        items.append(item)
                        answers.append(answer)
                if items:
                    batches.append((items, answers))
        scheduler = self.scheduler
        for items, answers in batches:
            outcomes = [read_answer(answer, self._codec, self._errors_codec) for answer in answers]
            if scheduler is not None:
                self._let_callers_return(scheduler)
                scheduler.answered(len(items), time.monotonic() - min(item.arrival for item in items))
            deliver(items, outcomes)
        if batches and scheduler is not None:
            scheduler.wake_parked()

    def _let_callers_return(self, scheduler: Scheduler) -> None:
        """Before answering a batch, let the callers of the one answered
        just before it come back, for at most _STAGGER_S. Two workers that
        finish together would otherwise have their callers come back
        together, sent together, start together and finish together again,
        every time, each batch's round trip twice as long."""
        until = time.monotonic() + _STAGGER_S
        while True:
            now = time.monotonic()
            if now >= until or not scheduler.callers_returning(now):
                return
            time.sleep(0.0002)

    def _fail_waiting(self, make_error: Callable[[], BaseException]) -> None:
        """Fail every call waiting for an answer. Their requests are deleted
        as each call ends (see :meth:`Ledger.ended`), so a worker that starts
        later does not run them for nobody."""
        waiting = [item for _, item in self._ledger.waiting()]
        if waiting:
            logger.warning("no worker has been alive for %gs: failing %d waiting calls", NO_WORKER_S, len(waiting))
        for item in waiting:
            item.task.fail(make_error())

    def _server_restarted(self) -> bool:
        """Whether the server is not the one the pending items were sent to; if
        so, send them again (a restarted server has lost them)."""
        if not self._server.changed(self._conn, self._keys.requests):
            return False
        self._send_again("another Redis server answers now (a restart, or a failover to a replica)")
        return True

    def _send_again(self, reason: str) -> None:
        """Send every unanswered request again: Redis lost them, or their
        answers. A request that ran already runs twice; its first answer wins."""
        unanswered = self._ledger.waiting()
        logger.warning("%s; sending %d unanswered requests again", reason, len(unanswered))
        if unanswered and self._send(unanswered, time.monotonic() + SEND_RETRY_S) is not None:
            raise ConnectionError(f"could not send again after {reason}")
