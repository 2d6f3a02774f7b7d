"""How a web process sends requests: a call's inputs in one command, the
callers it has just answered together once they are back, and never a
request held for callers who do not come back."""

from __future__ import annotations

import threading
import time
from typing import Any, Dict, List

from tests.redis.conftest import Broker


def _calls(broker: Broker, command: str) -> int:
    """How many times the (private) server has run ``command`` so far."""
    stats: Dict[str, Any] = broker.conn.info("commandstats")
    return int(stats.get(f"cmdstat_{command}", {}).get("calls", 0))


def test_a_calls_inputs_are_sent_in_one_command(fault_broker, make_streamer, start_worker):
    start_worker(fault_broker, lambda batch: [x + 1 for x in batch], batch_size=64)
    streamer = make_streamer(fault_broker)
    assert streamer.predict([0]) == [1]
    scripts, adds = _calls(fault_broker, "evalsha"), _calls(fault_broker, "xadd")
    assert streamer.predict(list(range(40))) == list(range(1, 41))
    assert _calls(fault_broker, "evalsha") - scripts == 1
    # Each input is still an entry of its own (the worker's answer is one more).
    assert _calls(fault_broker, "xadd") - adds == 41


def test_callers_coming_back_are_sent_together(fault_broker, make_streamer, start_worker):
    """16 callers in a closed loop: once answered, they come back one after
    another; their next requests go in about one command a round, not one
    each, nor one for each few that happen to be queued."""
    start_worker(fault_broker, lambda batch: [x * 2 for x in batch], batch_size=16, max_latency=0.1)
    streamer = make_streamer(fault_broker)
    assert streamer.predict([1]) == [2]
    rounds, clients, wrong = 20, 16, []
    before = _calls(fault_broker, "evalsha")

    def client(index: int) -> None:
        for n in range(rounds):
            value = index * 1000 + n
            if streamer.predict([value]) != [2 * value]:
                wrong.append(value)

    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not wrong and not any(thread.is_alive() for thread in threads)
    sends = _calls(fault_broker, "evalsha") - before
    # Measured here: about 2 sends a round (40 for 20 rounds); 70 when the
    # web side sends as soon as anything is queued, and 320 one by one.
    assert sends <= 3 * rounds, f"{sends} sends for {rounds} rounds of {clients} calls"


def test_a_request_is_not_held_for_callers_who_do_not_come_back(broker, make_streamer, start_worker):
    """Eight callers are answered and leave; the next call is sent at once
    (the web side waits for answered callers at most 10 ms) and runs."""
    arrived: List[float] = []

    def model(batch: List[Any]) -> List[Any]:
        arrived.append(time.monotonic())
        return batch

    start_worker(broker, model, batch_size=8, max_latency=0.01)
    streamer = make_streamer(broker)
    assert streamer.predict(list(range(8))) == list(range(8))
    submitted = time.monotonic()
    assert streamer.predict(["next"]) == ["next"]
    waited = arrived[-1] - submitted
    assert waited < 0.25, f"the call reached the model {waited:.3f}s after it was made"
