"""A Redis worker's main thread: take a batch from the reader when the model
is free, run it, and hand its answers to the writer.

:class:`ModelLoop` holds that loop and what it does with a batch before and
after the model: requests whose callers withdrew since they were read are
dropped unrun (Redis is asked, once they have waited here a while), expired
ones are counted and dropped, a request the reader could not decode is
answered with its error, and the batch runs in an OpenTelemetry span when
the worker traces. :class:`~.worker.RedisWorker` makes one as it starts
serving, with the threads it composes (:mod:`.reader`, :mod:`.answers`,
:mod:`.presence`).
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, List, Optional, Set, Tuple

from ...batching.runner import BatchRun, run_batch
from ...batching.shaping import batch_cost
from ...errors import StreamerTimeoutError
from ...options.config import BatchingConfig
from ...telemetry.stats import ModelStats
from ...telemetry.tracing import BatchFacts
from .answers import AnswerWriter, Outcome
from .intake import Input, ServerClock
from .presence import ModelWatch
from .reader import Handover
from .wire import GROUP, Keys, by_level

__all__ = ["ModelLoop"]

logger = logging.getLogger("streamer_core.redis")

# A batch whose requests were all read within this many seconds runs without
# asking Redis which of them their callers withdrew meanwhile (see
# ModelLoop._withdrawn): a caller rarely gives up within milliseconds of
# sending, and the question costs a round trip while every caller of the
# batch waits.
_RECHECK_AFTER_S = 0.01


class ModelLoop:
    """Runs one worker's batches on its main thread.

    ``conn`` is the main thread's own connection (asking which requests were
    withdrawn), ``consumer`` the worker's name in the consumer group,
    ``watch`` what the heartbeat reads of the model's progress, ``stopping``
    the worker's stop. :attr:`trace_facts` is set when the worker traces."""

    def __init__(
        self,
        config: BatchingConfig,
        stats: ModelStats,
        handover: Handover,
        watch: ModelWatch,
        clock: ServerClock,
        writer: AnswerWriter,
        conn: Any,
        keys: Keys,
        consumer: str,
        stopping: threading.Event,
    ) -> None:
        self._config = config
        self._stats = stats
        self._handover = handover
        self._watch = watch
        self._clock = clock
        self._writer = writer
        self._conn = conn
        self._keys = keys
        self._consumer = consumer
        self._stopping = stopping
        self.trace_facts: Optional[BatchFacts] = None

    def serve(self, predict: Any) -> None:
        """Run batches with ``predict`` as the reader hands them over, until
        the worker stops and the batches in hand are done."""
        handover = self._handover
        while True:
            batch, alone = handover.take(self._stopping)
            self._skip(handover.take_expired(), "expired")  # past their deadline while they waited here
            if batch is None:
                return
            if not batch:  # only expired requests, acknowledged above
                continue
            answered, seconds = self._run(predict, batch)
            self._watch.answered = self._watch.answered or seconds > 0
            handover.ran(answered, seconds, alone, self._clock.now_ms(refresh=False))

    def refuse(self, held: Input, error: BaseException) -> None:
        """Answer a request with ``error`` without running it."""
        self._writer.put([held.request], [(False, error)])

    def _run(self, predict: Any, batch: List[Input]) -> Tuple[int, float]:
        """Run ``batch`` and queue its answers for the writer; return how
        many callers it answers and the model's seconds (0 if it did not run)."""
        outcomes: List[Outcome] = [None] * len(batch)
        inputs, positions = [], []
        now_ms = self._clock.now_ms(refresh=False)
        withdrawn = self._withdrawn(batch)
        for position, held in enumerate(batch):
            request = held.request
            # Its caller has given up while it waited here: not run, not answered (acknowledged).
            if (held.level, request.entry_id) in withdrawn:
                self._stats.dropped("cancelled")
                continue
            if now_ms > request.created_ms() + request.timeout_ms:
                self._stats.dropped("expired")
                continue
            if held.error is not None:
                outcomes[position] = (False, held.error)
            else:
                inputs.append(held.value)
                positions.append(position)
        started = time.monotonic()
        if inputs:
            config = self._config
            waits_ms = max(batch[p].request.created_ms() + batch[p].request.timeout_ms - now_ms for p in positions)
            self._watch.started(started, started + waits_ms / 1000)
            try:
                if self.trace_facts is None:
                    run = run_batch(predict, inputs, config.isolate_errors, config.oom_errors)
                else:
                    run = self._traced(predict, inputs, [batch[p] for p in positions], now_ms)
            finally:
                self._watch.ended()
            for position, outcome in zip(positions, run.outcomes):
                outcomes[position] = outcome
            if run.oom_splits:
                self._stats.oom_split(run.oom_splits)
            self._handover.learn([batch[p].cost for p in positions], run.out_of_memory, run.ran)
        seconds = time.monotonic() - started if inputs else 0.0
        if inputs:
            # Each request's wait, by the server's clock: from its entry's time to now.
            arrivals = [started - max(0.0, now_ms - batch[p].request.created_ms()) / 1000 for p in positions]
            levels = [batch[p].level for p in positions] if self._stats.levels else None
            self._stats.batch_ran(started, seconds, arrivals, levels)
        self._writer.put([held.request for held in batch], outcomes)
        return sum(outcome is not None for outcome in outcomes), seconds

    def _traced(self, predict: Any, inputs: List[Any], held: List[Input], now_ms: float) -> BatchRun:
        """:func:`run_batch` inside the batch's span, linked to each caller's
        (its ``traceparent`` in the request). A request's queue wait starts
        when Redis took it in, by the server's clock, as the stats count it."""
        from ...telemetry.tracing import from_traceparent, traced_run

        facts = self.trace_facts
        assert facts is not None
        now_ns = time.time_ns()
        calls = [
            from_traceparent(h.request.trace, now_ns - int(max(0.0, now_ms - h.request.created_ms()) * 1e6))
            if h.request.trace is not None
            else None
            for h in held
        ]
        config = self._config
        cost = batch_cost(config.batch_cost, [h.cost for h in held])
        run, _ = traced_run(
            lambda: run_batch(predict, inputs, config.isolate_errors, config.oom_errors), facts, calls, cost
        )
        return run

    def _skip(self, dropped: List[Input], reason: str) -> None:
        """Acknowledge and delete ``dropped`` unrun, counted as dropped for
        ``reason``. One whose deadline has not passed yet (dropped because
        no batch could answer it in time) is answered ``StreamerTimeoutError``
        at once, as in-process: its caller hears now, and its web process
        has room to send another; nobody waits for the others."""
        if dropped:
            self._stats.dropped(reason, len(dropped))
            now_ms = self._clock.now_ms(refresh=False)
            outcomes: List[Outcome] = []
            for held in dropped:
                request = held.request
                left_ms = request.created_ms() + request.timeout_ms - now_ms
                outcomes.append(
                    None if left_ms <= 0 else (False, StreamerTimeoutError.unrun(request.timeout_ms / 1000))
                )
            self._writer.put([held.request for held in dropped], outcomes)

    def _withdrawn(self, batch: List[Input]) -> Set[Tuple[int, bytes]]:
        """The requests of ``batch`` whose callers gave up since they were
        read (their web process deleted them from the stream). Claiming the
        batch again tells: Redis 7 skips deleted entries (and drops them from
        the pending list). Asked only when a request of the batch has waited
        here ``_RECHECK_AFTER_S`` or more (read ahead while the model ran,
        or held for companions). On older servers, or when Redis does not
        answer, nothing counts as withdrawn: such a request runs, and its
        answer is dropped by its web process."""
        if time.monotonic() - min((held.arrival for held in batch), default=0.0) < _RECHECK_AFTER_S:
            return set()
        withdrawn: Set[Tuple[int, bytes]] = set()  # ids are per stream: two levels' may be equal
        for level, ids in by_level((held.level, held.request.entry_id) for held in batch).items():
            stream = self._keys.request_stream(level)
            try:
                kept = self._conn.xclaim(stream, GROUP, self._consumer, 0, ids, justid=True)
            except Exception as exc:
                logger.debug("could not re-claim a batch before running it: %s", exc)
                continue
            withdrawn.update((level, entry_id) for entry_id in set(ids).difference(kept))
        return withdrawn
