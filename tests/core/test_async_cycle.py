"""The serving cycle of async views (``Cycle.aserve``, what Django's async
batched views run): a cancelled request gives its call up and stays
cancelled, a parse hook's error is a counted 400, and a draining process
refuses with a counted 503. Each against a real ``BatchFuture``."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, Dict, List, Optional, Tuple

from streamer_core.future import BatchFuture
from streamer_core.telemetry.stats import stats_for
from streamer_core.web.cycle import Cycle

Answer = Tuple[int, Dict[str, Any], Dict[str, str]]


def _cycle() -> Cycle[Answer]:
    return Cycle(
        lambda status, body, headers: (status, body, headers),
        logging.getLogger("tests"),
        "the view",
        lambda: False,
        lambda exc: None,
    )


class _Unanswered:
    """A streamer whose calls are never answered: the request waits until it is cancelled."""

    def __init__(self) -> None:
        self.future = BatchFuture()
        self.future._deadline = time.monotonic() + 30
        self.submitted: List[Any] = []

    def submit(self, inputs: List[Any], priority: Optional[int] = None) -> BatchFuture:
        self.submitted.append(inputs)
        return self.future


def test_a_cancelled_request_gives_its_call_up_and_stays_cancelled():
    streamer = _Unanswered()
    loop_errors: List[Dict[str, Any]] = []

    async def main() -> Any:
        asyncio.get_running_loop().set_exception_handler(lambda loop, context: loop_errors.append(context))
        task = asyncio.ensure_future(_cycle().aserve("cancelled-call", lambda: streamer, lambda: 1, lambda out: out))
        await asyncio.sleep(0.05)  # submitted, waiting
        task.cancel()  # as Django cancels a view whose client disconnected
        try:
            answer = await task
        except asyncio.CancelledError:
            answer = "cancelled"
        await asyncio.sleep(0.05)  # the call's callbacks have run on the loop
        return answer

    answer = asyncio.run(main())
    # The cancellation goes on to the server (no response is made for it) ...
    assert answer == "cancelled", answer
    # ... the call is given up as the client's leaving ...
    assert streamer.submitted == [[1]]
    assert streamer.future.cancelled() and streamer.future._why == "disconnected"
    # ... and nothing failed on the loop afterwards (the waiter settled once).
    assert loop_errors == [], loop_errors


def test_a_parse_hooks_value_error_is_a_counted_400():
    def parse() -> Any:
        raise ValueError("no sentence in it")

    before = stats_for("bad-parse").snapshot().requests["invalid"]
    status, body, _ = asyncio.run(_cycle().aserve("bad-parse", _Unanswered, parse, lambda out: out))
    assert status == 400, body
    assert "no sentence in it" in body["error"]["message"]
    assert stats_for("bad-parse").snapshot().requests["invalid"] == before + 1


def test_a_draining_process_refuses_with_a_counted_503():
    streamer = _Unanswered()
    before = stats_for("draining-call").snapshot().requests["unavailable"]
    status, body, headers = asyncio.run(
        _cycle().aserve("draining-call", lambda: streamer, lambda: 1, lambda out: out, True)
    )
    assert status == 503 and headers.get("Retry-After"), (status, headers)
    assert body["error"]["type"] == "StreamerClosedError"
    assert streamer.submitted == []  # refused before anything was queued
    assert stats_for("draining-call").snapshot().requests["unavailable"] == before + 1
