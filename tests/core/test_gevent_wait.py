"""Waiting for a batch inside a gevent greenlet, gevent NOT monkey-patched
(as under gevent's WSGIServer run as it is): the wait yields to the hub, so
greenlets' calls are batched together and other greenlets keep running.

Each check runs in a subprocess of its own (this file run as a script), so
the pytest process never creates a gevent hub. A ticker greenlet that
sleeps 10 ms at a time measures the hub: while a caller waits on a model
that holds its thread for much longer, the ticker must keep ticking. The
control runs the same scenario with the library's greenlet-aware wait
turned off (a plain lock wait, as service_streamer's) and shows that the
measurement catches a blocked hub.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Dict, List

ROOT = Path(__file__).resolve().parents[2]
MODEL_SECONDS = 0.2  # the model holds its (real) thread this long per batch
TICK = 0.01
# The most a tick may be late by while the hub is free; a blocked hub makes
# it at least MODEL_SECONDS (or the result timeout) late.
MAX_GAP = 0.1


def run_scenario(name: str, *args: str) -> Dict[str, Any]:
    env = dict(os.environ, PYTHONPATH=str(ROOT), PYTHONUNBUFFERED="1")
    done = subprocess.run(
        [sys.executable, "-m", "tests.core.test_gevent_wait", name, *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, f"the scenario {name} failed:\n{done.stdout}\n{done.stderr}"
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_greenlets_calls_are_batched_and_the_hub_keeps_running():
    out = run_scenario("batch", "20")
    assert out["gevent_patched"] is False and out["unpatched_greenlet"] is True, out
    assert out["results"] == [[i * 10] for i in range(20)], "a caller got an answer that was not its own"
    assert sorted(x for batch in out["batches"] for x in batch) == list(range(20)), out["batches"]
    assert max(map(len, out["batches"])) > 1, f"no two greenlets' calls were batched together: {out['batches']}"
    # 20 calls in at most a few model calls, not 20 one after the other.
    assert len(out["batches"]) <= 4, out["batches"]
    assert out["elapsed"] < 10 * MODEL_SECONDS, out
    assert out["max_gap"] < MAX_GAP, f"the hub stopped for {out['max_gap']:.3f}s while greenlets waited"
    assert out["ticks"] >= out["elapsed"] / TICK / 3, (
        f"the ticker barely ran: {out['ticks']} ticks in {out['elapsed']:.2f}s"
    )


def test_gevent_monkey_imported_without_patching_threading_is_still_unpatched():
    """A program may import ``gevent.monkey`` and patch nothing, or only
    sockets (``patch_socket()``), or ask what is patched: its greenlets'
    calls still wait on the hub, and are batched together."""
    out = run_scenario("batch", "10", "--monkey-imported")
    assert out["gevent_patched"] is False and out["unpatched_greenlet"] is True, out
    assert out["results"] == [[i * 10] for i in range(10)], out
    assert max(map(len, out["batches"])) > 1, f"no two greenlets' calls were batched together: {out['batches']}"


def test_result_timeout_in_a_greenlet_raises_on_time_without_blocking_the_hub():
    out = run_scenario("timeout")
    assert out["unpatched_greenlet"] is True, out
    assert out["late_outcome"] == "StreamerTimeoutError", out
    assert 0.15 <= out["late_elapsed"] < 0.6, f"result(timeout=0.2) gave up after {out['late_elapsed']:.3f}s"
    assert out["late_cancelled"] is True, "the timed-out call was not given up"
    assert out["max_gap_while_late_waited"] < MAX_GAP, (
        f"the hub stopped for {out['max_gap_while_late_waited']:.3f}s while result(timeout) waited"
    )
    assert out["ticks_while_late_waited"] >= 5, out
    assert out["slow_result"] == ["ok:slow"], out
    assert ["late"] not in out["batches"] and all("late" not in batch for batch in out["batches"]), (
        f"a call its caller gave up on still reached the model: {out['batches']}"
    )


def test_the_main_greenlet_and_raw_greenlets_wait_without_blocking_the_hub():
    out = run_scenario("main")
    assert out["from_main"] == [10] and out["from_raw"] == [[20]], out
    assert out["max_gap"] < MAX_GAP, f"the hub stopped for {out['max_gap']:.3f}s while the main greenlet waited"


def test_several_greenlets_waiting_on_one_call_all_wake_and_a_failure_wakes_its_caller():
    out = run_scenario("shared")
    assert out["unpatched_greenlet"] is True, out
    assert out["shared"] == [[10]] * 3, f"not every greenlet waiting on the call got its result: {out['shared']}"
    assert out["shared_elapsed"] < 5 * MODEL_SECONDS, out
    assert out["failed"] == "ValueError: no 13 here", out
    assert out["failed_elapsed"] < 5 * MODEL_SECONDS, out
    assert out["max_gap"] < MAX_GAP, f"the hub stopped for {out['max_gap']:.3f}s while greenlets waited"


def test_once_its_greenlets_are_answered_the_hub_has_nothing_left_to_wait_for():
    """The watcher that wakes waiting greenlets does not itself keep the
    hub's loop alive: after a greenlet's call is answered, ``gevent.wait()``
    returns at once, as a program that waits for its greenlets to end needs."""
    out = run_scenario("idle")
    assert out["result"] == [10], out
    assert out["idle"] is True and out["elapsed"] < 1.0, out


def test_a_call_completed_as_its_greenlet_starts_to_wait_is_not_missed():
    """The model's thread completes the call after the greenlet found it
    pending but before its wake is in place, so the completion wakes nobody:
    the greenlet looks once more and returns, rather than sleeping out its
    timeout with the result in."""
    out = run_scenario("race")
    assert out["result"] == [1], out
    assert out["elapsed"] < 1.0, f"the greenlet slept {out['elapsed']:.2f}s with its result in"


def test_a_wait_after_the_hub_sat_idle_lasts_its_whole_timeout():
    """gevent's loop keeps its own clock, read when the loop runs. After the
    thread held it for a while (a model loaded, a long computation), a timer
    started from that stale clock fired at once: ``result(timeout=1)`` gave
    the call up straight away as timed out, with the answer 0.2 s off."""
    out = run_scenario("stale")
    assert out["result"] == [10], out
    assert MODEL_SECONDS * 0.8 <= out["elapsed"] < 1.0, out


def test_control_a_blocking_wait_is_caught_by_these_checks():
    """With the greenlet-aware wait turned off, every wait blocks the only
    OS thread: calls run one at a time and the ticker stalls. If this test
    fails, the checks above could not fail either."""
    out = run_scenario("batch", "4", "--blocking")
    assert max(map(len, out["batches"])) == 1, out["batches"]
    assert out["max_gap"] >= MODEL_SECONDS * 0.8, out
    out = run_scenario("timeout", "--blocking")
    assert out["late_outcome"] == "StreamerTimeoutError", out
    assert out["max_gap_while_late_waited"] >= 0.15, out


# -- the scenarios, run in a subprocess -----------------------------------------------


class _Ticker:
    def __init__(self) -> None:
        self.ticks: List[float] = []
        self.running = True

    def __call__(self) -> None:
        import gevent

        while self.running:
            self.ticks.append(time.monotonic())
            gevent.sleep(TICK)

    def max_gap(self, start: float, end: float) -> float:
        """The longest the hub left the ticker waiting between ``start`` and ``end``."""
        times = [start] + [t for t in self.ticks if start < t < end] + [end]
        return max(b - a for a, b in zip(times, times[1:]))

    def count(self, start: float, end: float) -> int:
        return sum(1 for t in self.ticks if start <= t <= end)


def _setup(blocking: bool, monkey_imported: bool = False) -> Any:
    import gevent  # imported, never monkey-patched

    if monkey_imported:
        import gevent.monkey  # noqa: F401  (imported, as a program asking what is patched does; nothing patched)

    import streamer_core.future
    from streamer_core.green import in_greenlet

    if blocking:
        streamer_core.future.in_greenlet = lambda: False
    probe = gevent.spawn(in_greenlet)
    probe.join()
    return gevent, probe.value


def _scenario_batch(n: int, blocking: bool, monkey_imported: bool = False) -> Dict[str, Any]:
    gevent, unpatched_greenlet = _setup(blocking, monkey_imported)
    from streamer_core import ThreadedStreamer

    batches: List[List[int]] = []

    def model(batch: List[int]) -> List[int]:
        batches.append(list(batch))
        time.sleep(MODEL_SECONDS)  # the real sleep: time is not patched; holds the model thread
        return [x * 10 for x in batch]

    streamer = ThreadedStreamer(model, batch_size=64, max_latency=0.05)
    ticker = _Ticker()
    ticking = gevent.spawn(ticker)
    gevent.sleep(0.05)
    start = time.monotonic()
    callers = [gevent.spawn(streamer.predict, [i]) for i in range(n)]
    gevent.joinall(callers, timeout=30)
    end = time.monotonic()
    ticker.running = False
    ticking.join()
    streamer.close()
    monkey = sys.modules.get("gevent.monkey")
    return {
        "gevent_patched": bool(monkey and monkey.is_module_patched("threading")),
        "unpatched_greenlet": unpatched_greenlet,
        "results": [caller.value for caller in callers],
        "batches": batches,
        "elapsed": end - start,
        "max_gap": ticker.max_gap(start, end),
        "ticks": ticker.count(start, end),
    }


def _scenario_timeout(blocking: bool) -> Dict[str, Any]:
    gevent, unpatched_greenlet = _setup(blocking)
    from streamer_core import StreamerTimeoutError, ThreadedStreamer

    batches: List[List[str]] = []

    def model(batch: List[str]) -> List[str]:
        batches.append(list(batch))
        time.sleep(1.0 if "slow" in batch else 0.0)
        return [f"ok:{x}" for x in batch]

    streamer = ThreadedStreamer(model, batch_size=8, max_latency=0.01, timeout=20)
    ticker = _Ticker()
    ticking = gevent.spawn(ticker)
    slow = streamer.submit(["slow"])  # no wait here: the late call's is the one measured
    while not batches:  # until the slow call holds the model
        gevent.sleep(0.005)
    late: Dict[str, Any] = {}

    def wait_late() -> None:
        future = streamer.submit(["late"])
        late["start"] = time.monotonic()
        try:
            future.result(timeout=0.2)
            late["outcome"] = "result"
        except StreamerTimeoutError as exc:
            late["outcome"] = type(exc).__name__
        late["end"] = time.monotonic()
        late["cancelled"] = future.cancelled()

    gevent.spawn(wait_late).join(10)
    ticker.running = False
    ticking.join()
    slow_result = slow.result(10)
    streamer.close()
    return {
        "unpatched_greenlet": unpatched_greenlet,
        "late_outcome": late.get("outcome"),
        "late_elapsed": late["end"] - late["start"],
        "late_cancelled": late.get("cancelled"),
        "max_gap_while_late_waited": ticker.max_gap(late["start"], late["end"]),
        "ticks_while_late_waited": ticker.count(late["start"], late["end"]),
        "slow_result": slow_result,
        "batches": batches,
    }


def _scenario_main_greenlet() -> Dict[str, Any]:
    """predict() from the main greenlet and from a spawn_raw greenlet (not
    gevent.Greenlets) while a ticker greenlet runs."""
    import gevent

    from streamer_core import ThreadedStreamer

    def model(batch: List[int]) -> List[int]:
        time.sleep(MODEL_SECONDS)
        return [x * 10 for x in batch]

    streamer = ThreadedStreamer(model, batch_size=8, max_latency=0.01)
    ticker = _Ticker()
    ticking = gevent.spawn(ticker)
    gevent.sleep(0.05)
    start = time.monotonic()
    from_main = streamer.predict([1])
    raw: List[Any] = []
    gevent.spawn_raw(lambda: raw.append(streamer.predict([2])))
    while not raw and time.monotonic() - start < 10:
        gevent.sleep(0.01)
    end = time.monotonic()
    ticker.running = False
    ticking.join()
    streamer.close()
    return {"from_main": from_main, "from_raw": raw, "max_gap": ticker.max_gap(start, end)}


def _scenario_shared() -> Dict[str, Any]:
    """Three greenlets wait on one call's future; then a call the model
    fails: its waiting greenlet must wake with the error, not time out."""
    gevent, unpatched_greenlet = _setup(False)
    from streamer_core import ThreadedStreamer

    def model(batch: List[int]) -> List[int]:
        time.sleep(MODEL_SECONDS)
        if 13 in batch:
            raise ValueError("no 13 here")
        return [x * 10 for x in batch]

    streamer = ThreadedStreamer(model, batch_size=8, max_latency=0.01, timeout=20)
    ticker = _Ticker()
    ticking = gevent.spawn(ticker)
    gevent.sleep(0.05)
    start = time.monotonic()
    future = streamer.submit([1])
    waiters = [gevent.spawn(future.result) for _ in range(3)]
    gevent.joinall(waiters, timeout=10)
    shared_end = time.monotonic()

    def fail() -> str:
        try:
            streamer.predict([13])
        except ValueError as exc:
            return f"{type(exc).__name__}: {exc}"
        return "no error"

    failing = gevent.spawn(fail)
    failing.join(10)
    end = time.monotonic()
    ticker.running = False
    ticking.join()
    streamer.close()
    return {
        "unpatched_greenlet": unpatched_greenlet,
        "shared": [waiter.value for waiter in waiters],
        "shared_elapsed": shared_end - start,
        "failed": failing.value,
        "failed_elapsed": end - shared_end,
        "max_gap": ticker.max_gap(start, end),
    }


def _scenario_idle() -> Dict[str, Any]:
    """A greenlet's call answered, then ``gevent.wait()`` for what is left."""
    import gevent

    from streamer_core import ThreadedStreamer

    streamer = ThreadedStreamer(lambda batch: [x * 10 for x in batch], batch_size=8, max_latency=0.01)
    caller = gevent.spawn(streamer.predict, [1])
    caller.join(10)
    start = time.monotonic()
    idle = gevent.wait(timeout=2)
    elapsed = time.monotonic() - start
    streamer.close()
    return {"result": caller.value, "idle": idle, "elapsed": elapsed}


def _scenario_race() -> Dict[str, Any]:
    """A future completed right after ``result()`` found it pending, before
    the greenlet's wake is installed (as a model thread may, at any moment)."""
    import gevent

    import streamer_core.future
    from streamer_core.future import BatchFuture

    future = BatchFuture()
    make_waiter = streamer_core.future.green_waiter

    def completed_meanwhile() -> Any:
        made = make_waiter()
        future.set_result([1])  # its wake finds no greenlet's hook yet
        return made

    streamer_core.future.green_waiter = completed_meanwhile  # type: ignore[assignment]
    start = time.monotonic()
    caller = gevent.spawn(future.result, 3.0)
    caller.join(10)
    return {"result": caller.value, "elapsed": time.monotonic() - start}


def _scenario_stale() -> Dict[str, Any]:
    """A call from the main greenlet after the OS thread held the hub's loop
    from running for longer than the call's timeout."""
    import gevent

    from streamer_core import ThreadedStreamer

    def model(batch: List[int]) -> List[int]:
        time.sleep(MODEL_SECONDS)
        return [x * 10 for x in batch]

    streamer = ThreadedStreamer(model, batch_size=8, max_latency=0.01)
    gevent.sleep(0.01)  # the loop runs, and reads its clock
    time.sleep(1.5)  # the thread busy elsewhere (time is not patched): the loop's clock 1.5 s behind
    start = time.monotonic()
    try:
        result: Any = streamer.submit([1]).result(1.0)
    except Exception as exc:  # the outcome, reported
        result = f"{type(exc).__name__}: {exc}"
    elapsed = time.monotonic() - start
    streamer.close()
    return {"result": result, "elapsed": elapsed}


def _main(argv: List[str]) -> None:
    blocking, monkey_imported = "--blocking" in argv, "--monkey-imported" in argv
    args = [a for a in argv if a not in ("--blocking", "--monkey-imported")]
    if args[0] == "batch":
        out = _scenario_batch(int(args[1]), blocking, monkey_imported)
    elif args[0] == "timeout":
        out = _scenario_timeout(blocking)
    elif args[0] == "main":
        out = _scenario_main_greenlet()
    elif args[0] == "shared":
        out = _scenario_shared()
    elif args[0] == "idle":
        out = _scenario_idle()
    elif args[0] == "race":
        out = _scenario_race()
    elif args[0] == "stale":
        out = _scenario_stale()
    else:
        raise SystemExit(f"unknown scenario {args[0]!r}")
    print(json.dumps(out))


if __name__ == "__main__":
    _main(sys.argv[1:])
