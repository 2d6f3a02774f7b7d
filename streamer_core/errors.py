"""Every error the streamers raise, rooted at :class:`StreamerError`.

The web layers map these to HTTP (:mod:`streamer_core.web.http`):
:class:`InvalidInput` and its kinds to their own 4xx status,
:class:`UnavailableError` (a full queue, no worker that can start) to 503
with ``Retry-After``, :class:`StreamerTimeoutError` to 504, anything raised
by the model itself to 500. Model exceptions are passed through as they are
(their own type), with the worker's traceback attached as ``__cause__`` when
they crossed a process. :class:`ConfigurationError` is a wrong setting,
raised where the settings are read, never at a request.
"""

from __future__ import annotations

from typing import List, Optional, Sequence

__all__ = [
    "StreamerError",
    "ConfigurationError",
    "InvalidInput",
    "MethodNotAllowed",
    "PayloadTooLarge",
    "UnsupportedMediaType",
    "LengthRequired",
    "ClientDisconnected",
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


class StreamerError(Exception):
    """Base class of every error raised by this package (not by your model)."""


class ConfigurationError(StreamerError, ValueError):
    """A setting is wrong; the message names each wrong setting as the user
    wrote it and says how to fix it. ``messages`` holds one line per wrong
    setting."""

    def __init__(self, message: str, messages: Optional[Sequence[str]] = None) -> None:
        super().__init__(message)
        self.messages: List[str] = list(messages) if messages is not None else [message]


class InvalidInput(StreamerError, ValueError):
    """The request could not be turned into a model input (HTTP 400). Raise
    it from a route's ``parse`` hook with a message for the client."""

    #: The HTTP status it is answered with.
    status = 400


class MethodNotAllowed(InvalidInput):
    """The endpoint does not serve this HTTP method (405, with ``Allow``)."""

    status = 405

    def __init__(self, method: str, allowed: Sequence[str]) -> None:
        super().__init__(f"{method} is not served here; use {', '.join(allowed)}")
        self.allowed = list(allowed)


class PayloadTooLarge(InvalidInput):
    """The body is larger than the endpoint takes (413)."""

    status = 413


class UnsupportedMediaType(InvalidInput):
    """The body is of a media type the endpoint does not read (415)."""

    status = 415


class LengthRequired(InvalidInput):
    """The body was sent in chunks to a server that cannot read a chunked
    body (411): send it with a ``Content-Length``."""

    status = 411


class ClientDisconnected(InvalidInput):
    """The client closed its connection before its whole body arrived: no
    input to run, and nobody to read an answer. Answered 499 (nginx's
    "client closed request", for the access log) and counted as
    ``cancelled``, as a client that leaves while its call waits; neither
    an invalid input nor a server error."""

    status = 499


class StreamerClosedError(StreamerError, RuntimeError):
    """The streamer was closed: it accepts no new calls, and calls it could not
    finish before closing fail with this error."""


class StreamerTimeoutError(StreamerError, TimeoutError):
    """A call did not finish within its timeout. Its items are dropped before
    they reach the model if they have not been sent to it yet."""

    @classmethod
    def unrun(cls, timeout_s: float, what: str = "it was not run") -> StreamerTimeoutError:
        """The error of a call that no batch could answer within its
        ``timeout_s``, failed at once rather than at its deadline; ``what``
        says what of it was not run. One wording in-process and from a
        Redis worker."""
        return cls(
            f"the call could not finish within its timeout of {timeout_s:.3g}s: the model's batches take longer "
            f"than it had left; {what}"
        )


class UnavailableError(StreamerError):
    """The streamer cannot take this call now; retrying later may succeed
    (HTTP 503). ``retry_after_s``, when set, is when to try again, in
    seconds (the ``Retry-After`` header); else the web layers' default."""

    retry_after_s: Optional[float] = None


class QueueFullError(UnavailableError):
    """The queue holds ``max_queue`` items already; the call was refused at
    once rather than queued without limit."""


class OverloadedError(QueueFullError):
    """The model is overloaded: the call's input waited longer than
    ``overload_wait`` in a queue that had not emptied for ``overload_after``
    seconds, and was refused unrun so that its caller may retry or go
    elsewhere now (:mod:`streamer_core.batching.overload`)."""

    retry_after_s = 1.0


class WorkerStartError(UnavailableError):
    """No worker could start (``init_model`` raised, or the process kept dying
    while starting). The worker's traceback is attached as ``__cause__``."""


class BrokerUnavailableError(UnavailableError):
    """The broker (Redis) cannot be reached, or refuses to queue the call
    (out of memory, a read-only replica); the call was not queued, or its
    answer could not be read back."""


class NoWorkerError(UnavailableError):
    """No worker has been alive to serve the queue lately (the Redis backend,
    with ``require_workers``): the call was refused rather than left to wait
    for its timeout."""


class WorkerDiedError(StreamerError):
    """The worker process running this item died, and the item was not retried
    (it was in a batch that killed a worker ``max_item_crashes`` times); or,
    on the thread backend, the model raised an exception that ends a thread
    (``SystemExit``, ``KeyboardInterrupt``: it is the ``__cause__``), which
    is not raised again in the caller's thread."""


class BatchLengthError(StreamerError):
    """The model returned a number of results different from the number of
    inputs in its batch; every caller of that batch gets this error."""


class SerializationError(StreamerError, TypeError):
    """A value could not be sent between processes (it cannot be pickled)."""


class ItemCostError(StreamerError, ValueError):
    """``item_cost`` raised for an input of this call, or did not return a
    positive number; the call was not queued (HTTP 400: it is the input that
    cannot be costed). The function's own exception is ``__cause__``."""


class RemoteError(StreamerError):
    """An exception raised in a worker process that could not be re-created
    here as its own type (it cannot be pickled). ``exc_type`` names the
    original type; the worker's traceback is attached as ``__cause__``."""

    def __init__(self, exc_type: str, message: str) -> None:
        super().__init__(f"{exc_type}: {message}")
        self.exc_type = exc_type


class RemoteTraceback(Exception):
    """Carries a worker's formatted traceback; set as ``__cause__`` of an
    exception that crossed a process, so it prints below the local one."""

    def __init__(self, tb: str) -> None:
        super().__init__(tb)
        self.tb = tb

    def __str__(self) -> str:
        return self.tb
