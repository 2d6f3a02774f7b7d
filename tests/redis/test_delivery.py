"""Who holds a request: a worker takes only the batch it is about to run,
and what a worker that dies held is run by another, once; an input that
kills every worker that runs it fails clearly and spares the others."""

from __future__ import annotations

import json
import os
import signal
import time

import pytest
import redis

from streamer_core import WorkerDiedError
from tests.conftest import Gate
from tests.redis import models
from tests.redis.conftest import GROUP, alive, wait_for, wait_serving, worker_children


def test_a_worker_holds_the_batch_it_runs_and_at_most_one_more(broker, make_streamer, start_worker):
    """A worker reads its next batch while the model runs the current one,
    and no further: what it holds pending under its name (and would leave
    to others if killed) is never more than two batches."""
    streamer = make_streamer(broker)
    futures = [streamer.submit([x]) for x in range(40)]
    broker.wait_queued(40)
    looker = redis.Redis.from_url(broker.url)
    held = []

    def model(batch: list) -> list:
        # While this batch runs, what does Redis say the worker holds? Give the
        # reader a moment to take the next batch, and the writer to finish
        # acknowledging the previous one.
        time.sleep(0.03)
        held.append((len(batch), int(looker.xpending(broker.requests, GROUP)["pending"])))
        return [x * 2 for x in batch]

    try:
        start_worker(broker, model, batch_size=4, max_latency=0.05)
        assert [f.result(10) for f in futures] == [[x * 2] for x in range(40)]
    finally:
        looker.close()
    assert [size for size, _ in held] == [4] * 10
    assert all(pending <= 8 for _, pending in held), f"(batch, pending) while running: {held}"
    assert any(pending == 8 for _, pending in held[:-1]), f"the next batch should be read while one runs: {held}"
    assert broker.pending() == 0 and broker.xlen() == 0


def _inside(folder) -> list:
    return sorted(folder.glob("inside-*"))


def test_a_worker_killed_mid_batch_loses_nothing(fault_broker, make_streamer, procs, tmp_path):
    """Killed while its model runs, a worker holds its batch and the next
    one, read ahead: the other worker takes both over and answers them all."""
    (tmp_path / "hold").write_text("")
    streamer = make_streamer(fault_broker, timeout=20)
    futures = [streamer.submit([x]) for x in range(16)]
    fault_broker.wait_queued(16)
    # Two workers started on a full queue each run a batch of 4 and read 4 more.
    workers = [
        procs.worker(
            fault_broker,
            "HoldModel",
            batch_size=4,
            max_latency=0.05,
            claim_after=0.5,
            model_init_kwargs={"folder": str(tmp_path)},
        )
        for _ in range(2)
    ]
    assert wait_for(lambda: len(_inside(tmp_path)) == 2 and fault_broker.pending() == 16, 15), procs.all_logs()
    running = [x for m in _inside(tmp_path) for x in json.loads(m.read_text())]
    assert len(running) == 8 and len(set(running)) == 8
    victim = int(_inside(tmp_path)[0].name.split("-")[1])
    os.kill(victim, signal.SIGKILL)
    killed_at = time.monotonic()
    (tmp_path / "hold").unlink()
    assert [f.result(15) for f in futures] == [[x * 2] for x in range(16)]
    assert time.monotonic() - killed_at < 10.0, "the dead worker's requests should be taken over after claim_after"
    assert wait_for(lambda: fault_broker.pending() == 0 and fault_broker.xlen() == 0, 3), (
        "requests taken over must be acknowledged and deleted"
    )
    survivor = next(w for w in workers if w.pid != victim)

    # The survivor took over the batch that ran and the one read ahead, and
    # said so in two lines: the first request, then the seven more once it
    # found none left (its next look, claim_after / 2 later).
    def taken_lines() -> list:
        return [line for line in procs.log(survivor).splitlines() if "took over" in line]

    assert wait_for(lambda: len(taken_lines()) >= 2, 5), taken_lines()
    said = taken_lines()
    assert len(said) == 2, said
    assert "took over request " in said[0] and "took over 7 more requests" in said[1], said
    assert streamer.predict([100, 101]) == [200, 202], "the survivor keeps serving"


def test_requests_taken_over_by_a_slow_worker_are_not_failed(
    fault_broker, make_streamer, start_worker, procs, tmp_path
):
    """A worker dies holding a batch; the one taking it over runs each request
    alone and slowly (longer than claim_after). Requests waiting their turn
    must not be claimed again meanwhile: every caller gets its result, and
    each request runs once. (Once, they were failed with WorkerDiedError.)"""
    (tmp_path / "hold").write_text("")
    streamer = make_streamer(fault_broker, timeout=20)
    futures = [streamer.submit([x]) for x in range(4)]
    fault_broker.wait_queued(4)
    dying = procs.worker(
        fault_broker,
        "HoldModel",
        batch_size=4,
        max_latency=0.05,
        claim_after=0.5,
        model_init_kwargs={"folder": str(tmp_path)},
    )
    assert wait_for(lambda: _inside(tmp_path), 15), procs.log(dying)
    assert json.loads(_inside(tmp_path)[0].read_text()) == [0, 1, 2, 3]
    os.kill(dying.pid, signal.SIGKILL)
    ran = []

    def slow(batch: list) -> list:  # each request taken over runs alone, for 0.35 s
        ran.extend(batch)
        time.sleep(0.35)
        return [x * 2 for x in batch]

    start_worker(fault_broker, slow, batch_size=4, claim_after=0.5)
    outcomes = []
    for future in futures:
        try:
            outcomes.append(future.result(15))
        except Exception as exc:
            outcomes.append(repr(exc))
    assert outcomes == [[x * 2] for x in range(4)]
    assert sorted(ran) == [0, 1, 2, 3], f"each request should run once; ran {ran}"


def test_an_input_that_kills_every_worker_fails_with_worker_died_error(fault_broker, make_streamer, procs):
    supervisor = procs.supervisor(
        fault_broker,
        "kill_self_on_poison",
        batch_size=1,
        max_latency=0.0,
        worker_num=2,
        claim_after=0.5,
        max_item_crashes=2,
    )
    assert wait_for(lambda: len(worker_children(supervisor.pid)) == 2, 20)
    wait_serving(procs, supervisor, worker_children(supervisor.pid))
    streamer = make_streamer(fault_broker, timeout=30)
    inputs = ["a", "b", "poison", "c", "d", "e"]
    futures = [streamer.submit([text]) for text in inputs]
    started = time.monotonic()
    for text, future in zip(inputs, futures):
        if text == "poison":
            with pytest.raises(WorkerDiedError, match="not retried") as info:
                future.result(25)
            assert "2 workers that died" in str(info.value)
        else:
            assert future.result(25) == [text.upper()]
    assert time.monotonic() - started < 20
    log = procs.log(supervisor, tail=None)
    assert log.count("restarting it") >= 2, "the two workers the poison killed should have been restarted"
    assert streamer.predict(["still", "serving"]) == ["STILL", "SERVING"]
    assert wait_for(lambda: fault_broker.pending() == 0 and fault_broker.xlen() == 0, 3)


def test_inputs_batched_with_a_poison_input_are_not_failed_with_it(fault_broker, make_streamer, procs):
    """The poison input kills the worker holding the whole batch, then the one
    that takes it over; only the poison input fails with WorkerDiedError.
    (Once, the inputs taken over with it but not yet run failed too.)"""
    streamer = make_streamer(fault_broker, timeout=30)
    inputs = ["a", "b", "poison", "c", "d"]
    futures = [streamer.submit([text]) for text in inputs]
    fault_broker.wait_queued(len(inputs))
    # Started after the calls are queued, a worker takes all five as one batch.
    supervisor = procs.supervisor(
        fault_broker,
        "kill_self_on_poison",
        batch_size=8,
        max_latency=0.05,
        worker_num=2,
        claim_after=0.5,
        max_item_crashes=2,
    )
    outcomes = []
    for future in futures:
        try:
            outcomes.append(future.result(25))
        except Exception as exc:
            outcomes.append(type(exc).__name__)
    assert outcomes == [["A"], ["B"], "WorkerDiedError", ["C"], ["D"]], procs.log(supervisor)


def test_a_worker_stopped_with_sigterm_finishes_its_batch_first(fault_broker, make_streamer, procs, tmp_path):
    (tmp_path / "hold").write_text("")
    worker = procs.worker(fault_broker, "HoldModel", batch_size=4, model_init_kwargs={"folder": str(tmp_path)})
    streamer = make_streamer(fault_broker)
    future = streamer.submit([7])
    assert wait_for(lambda: _inside(tmp_path), 15), procs.log(worker)
    worker.send_signal(signal.SIGTERM)
    time.sleep(0.3)
    assert alive(worker.pid), "SIGTERM must let the batch in hand finish"
    (tmp_path / "hold").unlink()
    assert future.result(10) == [14]
    assert worker.wait(10) == 0
    assert fault_broker.pending() == 0


def test_requests_a_stopping_worker_holds_unknowingly_are_still_taken_over(broker, make_streamer, start_worker, gate):
    """Used to fail: a stopping worker removed its consumer when it held
    nothing it knew of, dropping requests pending under its name that it
    never saw (a read whose reply was lost), so nobody took them over."""
    first = start_worker(broker, gate, batch_size=1, claim_after=0.5)
    # Every request sent as it comes (no overload rule, which would hold the
    # third back while the worker's two batches are out).
    streamer = make_streamer(broker, timeout=8, overload_after=None)
    held = streamer.submit(["hold"])
    assert gate.entered.wait(5)
    ahead = streamer.submit(["ahead"])  # the worker reads it as its next batch, and reads no more
    assert wait_for(lambda: broker.pending() == 2, 3)
    lost = streamer.submit(["lost"])
    broker.wait_queued(3)
    # A read by this worker whose reply never reached it (a connection blip):
    # the request is pending under the worker's name, unknown to the worker.
    reply = broker.conn.xreadgroup(GROUP, first.worker.consumer, {broker.requests: ">"}, count=1)
    assert reply and reply[0][1][0][1][b"i"], "the test should have taken the request in the worker's name"
    first.worker.stop()
    gate.release()
    assert held.result(5) == ["ok:hold"]
    assert ahead.result(5) == ["ok:ahead"], "a stopping worker finishes the batch it read ahead"
    first.thread.join(5)
    start_worker(broker, gate, batch_size=4, claim_after=0.5)
    assert lost.result(4) == ["ok:lost"], "a request pending under a stopped worker was never run"


def test_while_one_worker_is_busy_requests_go_to_a_free_one(broker, make_streamer, start_worker):
    """A busy worker reads ahead only a full batch: fewer requests than that
    are for a free worker to run now, not to wait behind the busy one's
    model, as in-process workers are handed batches."""
    gate = Gate()
    busy = start_worker(broker, gate, batch_size=8, claim_after=0.3)
    free = start_worker(broker, models.with_pid, batch_size=8, claim_after=0.3)
    streamer = make_streamer(broker, timeout=10)
    # Both workers beat a few times, so that neither takes itself for the only one.
    assert wait_for(lambda: streamer.live_workers() == 2, 5)
    time.sleep(0.3)
    held = streamer.submit(["hold"])
    while not gate.entered.wait(0.05):
        if held.done():  # the free worker ran it: send it again until the gated one does
            held = streamer.submit(["hold"])
    for round_ in range(5):
        answers = [f.result(3) for f in [streamer.submit([n]) for n in range(3)]]
        assert all(isinstance(a[0], list) for a in answers), f"round {round_}: run by the busy worker: {answers}"
    assert not held.done()
    gate.release()
    assert held.result(5) == ["ok:hold"]
    assert busy.alive() and free.alive()


def test_the_sweep_of_dead_workers_consumers_spares_one_that_still_holds_requests(
    broker, make_streamer, start_worker, monkeypatch
):
    """A worker coming up after a long outage first sweeps away the consumers
    of dead workers, then takes over what they held: a consumer still
    holding requests is left for the takeover (deleting it would drop them
    from the group, and their callers would wait in vain)."""
    from streamer_core.backends.redis import intake

    monkeypatch.setattr(intake, "SWEEP_IDLE_S", 0.3)  # instead of a minute's outage
    first = start_worker(broker, models.double, batch_size=4, claim_after=0.01)
    streamer = make_streamer(broker, timeout=15)
    assert streamer.predict([1]) == [2]
    first.worker.stop()
    first.thread.join(5)
    lost = streamer.submit([21])
    broker.wait_queued(1)
    # A worker that read the request, then died before answering it.
    reply = broker.conn.xreadgroup(GROUP, "dead-worker", {broker.requests: ">"}, count=1)
    assert reply and reply[0][1], "the test should have taken the request in a dead worker's name"
    time.sleep(0.6)  # the dead worker's consumer is idle past the sweep's bound
    start_worker(broker, models.double, batch_size=4, claim_after=0.01)
    assert lost.result(10) == [42], "the request a dead worker held was dropped with its consumer"


def test_a_dead_workers_requests_are_taken_over_while_new_ones_keep_coming(broker, make_streamer, start_worker):
    """Requests arriving without a pause keep a worker's read-ahead from
    ever being empty: what a dead worker held is still taken over, one at
    a time between batches, not left until the traffic stops (each such
    caller has already waited ``claim_after``, and would time out)."""
    streamer = make_streamer(broker, timeout=20)
    lost = [streamer.submit([100 + n]) for n in range(6)]
    broker.wait_queued(6)
    # A worker that read them, then died before answering.
    broker.conn.xgroup_create(broker.requests, GROUP, id="0")
    reply = broker.conn.xreadgroup(GROUP, "dead-worker", {broker.requests: ">"}, count=6)
    assert reply and len(reply[0][1]) == 6, "the test should have taken the requests in a dead worker's name"

    def model(batch: list) -> list:
        time.sleep(0.03)  # a batch takes a while; new requests arrive meanwhile
        return [x * 2 for x in batch]

    start_worker(broker, model, batch_size=64, max_latency=0.01, claim_after=0.3)
    arriving, started = [], time.monotonic()
    while not all(f.done() for f in lost) and time.monotonic() - started < 8:
        arriving.append(streamer.submit([len(arriving) % 50]))  # one every 2 ms, never waiting
        time.sleep(0.002)
    taken_over_in = time.monotonic() - started
    assert [f.result(1) for f in lost] == [[2 * (100 + n)] for n in range(6)]
    assert taken_over_in < 4, f"taken over in {taken_over_in:.1f} s, {len(arriving)} requests arriving meanwhile"
    assert all(f.result(10) == [2 * (n % 50)] for n, f in enumerate(arriving))
