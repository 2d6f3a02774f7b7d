"""The answers of a batch: written by a Redis worker's writer thread,
read by the web process (:func:`read_answer`).

While the model runs the next batch, the writer writes the answers of the
last one: one result entry per web process whose requests it holds, on that
web process's results stream, and the requests acknowledged and deleted,
all in one transaction (:meth:`AnswerWriter.run`). Through a Redis blip it
keeps trying, since the answers are kept nowhere else; a request that is
never answered stays pending under the worker, and another worker takes it
over once this one's heartbeat stops.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from typing import Any, Dict, List, Optional, Sequence, Tuple

from ...codec import Codec, decode_error, encode_error, get_codec
from ...errors import SerializationError
from ...options.redis_address import RedisAddress
from .connection import MAX_BACKOFF_S, LoopErrors, broker_errors, connect
from .intake import Hands, ServerClock
from .wire import (
    GROUP,
    RESULTS_MAXLEN,
    RESULTS_TTL_S,
    WIRE_VERSION,
    Answer,
    Keys,
    Request,
    Result,
    by_level,
    legacy_result_entry,
    result_entry,
)

__all__ = ["AnswerWriter", "Outcome", "read_answer"]

logger = logging.getLogger("streamer_core.redis")

#: One request's outcome: (True, output), (False, error), or None when its
#: caller has given up (nothing is written back).
Outcome = Optional[Tuple[bool, Any]]


class AnswerWriter:
    """Writes the answers of a worker's batches, one batch at a time, on a
    thread of its own (:meth:`run`), over a connection of its own."""

    def __init__(
        self,
        address: RedisAddress,
        keys: Keys,
        codec: Codec,
        hands: Hands,
        clock: ServerClock,
        stopping: threading.Event,
    ) -> None:
        self._address = address
        self._keys = keys
        self._codec = codec
        # Errors are plain data: msgpack, which every web process can read safely.
        self._errors_codec: Codec = get_codec("msgpack")
        self._hands = hands
        self._clock = clock
        self._stopping = stopping
        # One batch's answers wait here while the one before is written, so
        # writing overlaps running the next batch, and no more piles up.
        self._outbox: queue.Queue[Optional[Tuple[List[Request], List[Outcome]]]] = queue.Queue(maxsize=1)

    def put(self, batch: List[Request], outcomes: List[Outcome]) -> None:
        """Answer ``batch`` with ``outcomes``; waits while a batch before it
        is still to be written."""
        self._outbox.put((batch, outcomes))

    def finish(self) -> None:
        """Answer what is in hand, then end :meth:`run`."""
        self._outbox.put(None)

    def run(self) -> None:
        """Answer each batch: write its results, acknowledge its requests."""
        conn = connect(self._address)
        errors = LoopErrors("the Redis worker's writer")
        while True:
            job = self._outbox.get()
            if job is None:
                break
            batch, outcomes = job
            try:
                self._answer(conn, batch, outcomes, errors)
            except Exception as exc:  # left pending: they are taken over and run again
                errors.log(exc)
            self._hands.release(batch)
        conn.close()

    def _answer(self, conn: Any, batch: Sequence[Request], outcomes: Sequence[Outcome], errors: LoopErrors) -> bool:
        """Write every result and acknowledge the requests, in one transaction:
        one result entry per web process. Through a Redis blip keep trying,
        since these answers are not kept anywhere else; once stopping, give up
        after a while (the requests stay pending, and another worker takes
        them over)."""
        import redis

        entries = self._entries(batch, outcomes)
        ids = by_level((request.level, request.entry_id) for request in batch)  # a stream per priority level
        delay, give_up_at, refused = 0.05, None, False
        while True:
            try:
                pipe = conn.pipeline(transaction=True)
                for key, fields in entries:
                    pipe.xadd(key, fields, maxlen=RESULTS_MAXLEN, approximate=True)
                for key in dict.fromkeys(key for key, _ in entries):
                    pipe.expire(key, RESULTS_TTL_S)
                for level, level_ids in ids.items():
                    pipe.xack(self._keys.request_stream(level), GROUP, *level_ids)
                    pipe.xdel(self._keys.request_stream(level), *level_ids)
                replies = pipe.execute(raise_on_error=False)
                for (key, _), reply in zip(entries, replies):
                    if isinstance(reply, Exception):
                        # E.g. the key holds another type: its web process repairs it and sends again.
                        errors.log(RuntimeError(f"could not write an answer to {key}: {reply}"))
                return True
            except broker_errors() as exc:
                logger.warning("could not write %d results to Redis (%s); retrying", len(batch), exc)
            except redis.ResponseError as exc:
                # Refused as a whole (the transaction): out of memory under
                # maxmemory, a read-only replica. Often for a while only, and
                # dropping the answers would have the batch run again.
                if self._callers_gone(batch):
                    logger.error("Redis refused %d results (%s) until their callers had given up", len(batch), exc)
                    return False
                if not refused:
                    refused = True
                    logger.warning("Redis refused %d results (%s); retrying while their callers wait", len(batch), exc)
            if self._stopping.is_set():
                give_up_at = give_up_at or time.monotonic() + 10.0
                if time.monotonic() > give_up_at:
                    logger.error("gave up writing %d results; another worker will run them again", len(batch))
                    return False
            time.sleep(delay)
            delay = min(MAX_BACKOFF_S, delay * 2)

    def _callers_gone(self, batch: Sequence[Request]) -> bool:
        """Whether every request of ``batch`` is past its deadline."""
        now_ms = self._clock.now_ms(refresh=False)
        return all(now_ms > request.created_ms() + request.timeout_ms for request in batch)

    def _entries(self, batch: Sequence[Request], outcomes: Sequence[Outcome]) -> List[Tuple[str, Dict[Any, Any]]]:
        """The entries answering ``batch``: one per web process (and one per
        answer for a web process of 0.1.0), keyed by its results stream."""
        grouped: Dict[str, List[Answer]] = {}
        entries = []
        for request, outcome in zip(batch, outcomes):
            if outcome is None:
                continue  # its caller has given up
            key = self._keys.results(request.client)
            item_id, ok, payload, buffers = self._encode(request, outcome)
            if request.version == 0:
                entries.append((key, legacy_result_entry(item_id, ok, self._codec.name if ok else "msgpack", payload)))
            else:
                grouped.setdefault(key, []).append((item_id, ok, payload, buffers))
        entries.extend((key, result_entry(answers, self._codec.name)) for key, answers in grouped.items())
        return entries

    def _encode(self, request: Request, outcome: Tuple[bool, Any]) -> Answer:
        ok, value = outcome
        if ok:
            try:
                if request.version == 0:  # its codec reads no out-of-band buffers
                    return request.item_id, True, self._codec.encode(value), ()
                payload, buffers = self._codec.dumps(value)
                return request.item_id, True, payload, buffers
            except SerializationError as exc:
                value = SerializationError(f"the model's result cannot be sent back: {exc}")
        return request.item_id, False, self._errors_codec.encode(encode_error(value)), ()


def read_answer(answer: Result, codec: Codec, errors_codec: Codec) -> Tuple[bool, Any]:
    """An answer as the web process reads it: ``(True, output)`` or
    ``(False, error)``. Outputs are read with this side's ``codec`` only;
    errors, plain data, with ``errors_codec`` (msgpack) whatever the codec:
    an answer in another codec (a pickle this side did not opt into) is
    refused, never loaded."""
    try:
        if answer.version > WIRE_VERSION:
            raise SerializationError(
                f"it was written by a newer version of streamer_core (wire format {answer.version}; this "
                f"side reads up to {WIRE_VERSION}): upgrade the web processes"
            )
        if answer.codec == codec.name:
            value = codec.loads(answer.payload, answer.buffers)
        elif answer.codec == "msgpack":  # plain data: safe to read whatever this side's codec
            value = errors_codec.loads(answer.payload, answer.buffers)
        else:
            raise SerializationError(f"refusing a {answer.codec!r} answer: this side reads {codec.name!r}")
    except Exception as exc:
        logger.warning("refused a result from Redis: %s", exc)
        return False, SerializationError(f"the worker's answer could not be read: {exc}")
    if answer.ok:
        return True, value
    return False, decode_error(value)
