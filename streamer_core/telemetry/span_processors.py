"""What a :class:`~streamer_core.telemetry.span_recorder.Recorder` calls of the span
processors of the provider it records for, and how: a processor's hook
whose body is empty is not called (:func:`does_nothing`), and the SDK's own
``BatchSpanProcessor`` is handed each ended span on its queue
(:class:`BatchQueue`), without what its ``on_end`` does that a recorder's
span does not need."""

from __future__ import annotations

import collections
from typing import Any, Callable

from opentelemetry.sdk.trace import SpanProcessor
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.trace import TraceFlags

__all__ = ["BatchQueue", "does_nothing", "ender"]

_SAMPLED = TraceFlags.SAMPLED


def ender(processor: SpanProcessor) -> Callable[[Any], None]:
    """What is called with each span as it ends, for one of the provider's
    processors: its ``on_end``, or for the SDK's own ``BatchSpanProcessor``
    a :class:`BatchQueue` onto its queue."""
    if type(processor) is BatchSpanProcessor and BatchQueue.fits(getattr(processor, "_batch_processor", None)):
        return BatchQueue(processor)
    return processor.on_end


class BatchQueue:
    """``BatchSpanProcessor.on_end`` without its system call per span.

    The SDK's batch processor asks ``os.getpid()`` for every span it is
    handed, to find out whether the process was forked since it started,
    though its fork hook (``os.register_at_fork``) has started its worker
    again in a forked child already. Where a system call costs what it does
    in a virtual machine, that call was most of what recording a trace cost
    a served request (the docs' Performance page, "What tracing costs"). Here the
    span goes onto the processor's queue as ``emit`` puts it there, and
    what is not that plain case (a full queue, a processor shut down) goes
    to ``emit`` itself, which logs and counts it as it does. What is lost:
    a child forked by C code that runs no fork hooks, where ``emit`` would
    have started the worker, exports nothing. Used for the SDK's own class
    only, whose fields it checks as it is made (:meth:`fits`)."""

    __slots__ = ("_batch",)

    def __init__(self, processor: Any) -> None:
        self._batch = processor._batch_processor

    @staticmethod
    def fits(batch: Any) -> bool:
        """Whether ``batch`` (a BatchSpanProcessor's ``_batch_processor``)
        keeps its queue as this SDK's does."""
        return (
            batch is not None
            and callable(getattr(batch, "emit", None))
            and isinstance(getattr(batch, "_queue", None), collections.deque)
            and isinstance(getattr(batch, "_shutdown", None), bool)
            and isinstance(getattr(batch, "_max_queue_size", None), int)
            and isinstance(getattr(batch, "_max_export_batch_size", None), int)
            and callable(getattr(getattr(batch, "_worker_awaken", None), "set", None))
        )

    def __call__(self, span: Any) -> None:
        if not span._context[3] & _SAMPLED:  # as on_end: a span recorded but not sampled is not exported
            return
        batch = self._batch
        queue = batch._queue
        if batch._shutdown or len(queue) >= batch._max_queue_size:
            batch.emit(span)  # logged and counted as dropped there
            return
        queue.appendleft(span)
        if len(queue) >= batch._max_export_batch_size and not batch._worker_awaken.is_set():
            batch._worker_awaken.set()


def _empty(*args: Any, **kwargs: Any) -> None:
    pass


def _documented(*args: Any, **kwargs: Any) -> None:
    """A method that says what it is for, and does nothing."""


# The bytecode of a function whose body does nothing, in this interpreter.
_NOTHING = {_empty.__code__.co_code, _documented.__code__.co_code}


def does_nothing(method: Any) -> bool:
    """Whether ``method`` is a Python function whose body is empty (``pass``
    or a docstring): calling it is skipped with nothing lost."""
    code = getattr(getattr(method, "__func__", method), "__code__", None)
    return code is not None and code.co_code in _NOTHING
