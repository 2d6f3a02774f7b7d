"""run_redis_workers_forever and the streamer-worker command: dead workers
are replaced, a model that cannot load is not retried forever, SIGTERM
drains and exits 0, and each worker gets its CUDA device."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import pytest

from streamer_core import StreamerError, StreamerTimeoutError
from tests.helpers import beating_workers
from tests.redis.conftest import alive, wait_for, wait_serving, worker_children


def test_a_killed_worker_process_is_replaced_and_calls_are_still_served(fault_broker, make_streamer, procs):
    supervisor = procs.supervisor(fault_broker, "with_pid", batch_size=4, worker_num=2, claim_after=0.5)
    assert wait_for(lambda: len(worker_children(supervisor.pid)) == 2, 20), procs.log(supervisor)
    first = worker_children(supervisor.pid)
    wait_serving(procs, supervisor, first)
    streamer = make_streamer(fault_broker, timeout=15)
    assert [x for x, _ in streamer.predict(list(range(8)))] == list(range(8))
    victim = first[0]
    os.kill(victim, signal.SIGKILL)
    assert wait_for(lambda: len(set(worker_children(supervisor.pid)) - set(first)) == 1, 15), procs.log(supervisor)
    [replacement] = set(worker_children(supervisor.pid)) - set(first)
    assert not alive(victim)
    wait_serving(procs, supervisor, [replacement])
    with ThreadPoolExecutor(8) as pool:
        answers = [a for r in pool.map(lambda x: streamer.predict([x]), range(40)) for a in r]
    assert [x for x, _ in answers] == list(range(40))
    assert {pid for _, pid in answers} <= {first[1], replacement}
    assert supervisor.poll() is None
    assert "restarting it" in procs.log(supervisor)
    # Ctrl-C: the workers finish, and run_redis_workers_forever returns 0.
    supervisor.send_signal(signal.SIGINT)
    assert supervisor.wait(15) == 0, procs.log(supervisor)
    assert not any(alive(pid) for pid in (first[1], replacement))


def test_a_worker_killed_after_drawing_a_progress_bar_leaves_no_semaphore_behind(fault_broker, make_streamer, procs):
    """As on the process backend: tqdm's lock in a spawned worker was a named
    semaphore that a SIGKILL left for the resource tracker to call leaked
    when the supervisor stopped."""
    pytest.importorskip("tqdm")
    supervisor = procs.supervisor(fault_broker, "ProgressBarModel", batch_size=4, claim_after=0.5)
    assert wait_for(lambda: len(worker_children(supervisor.pid)) == 1, 20), procs.log(supervisor)
    [first] = worker_children(supervisor.pid)
    wait_serving(procs, supervisor, [first])
    streamer = make_streamer(fault_broker, timeout=15)
    assert streamer.predict([1]) == [first]
    os.kill(first, signal.SIGKILL)
    assert wait_for(lambda: set(worker_children(supervisor.pid)) - {first}, 15), procs.log(supervisor)
    [replacement] = set(worker_children(supervisor.pid)) - {first}
    wait_serving(procs, supervisor, [replacement])
    assert streamer.predict([2]) == [replacement]
    supervisor.send_signal(signal.SIGINT)
    assert supervisor.wait(15) == 0, procs.log(supervisor)
    time.sleep(0.5)  # the resource tracker writes as it ends, after the supervisor
    assert "leaked" not in procs.log(supervisor, tail=None), procs.log(supervisor)


def test_a_worker_stuck_in_a_batch_nobody_waits_for_is_restarted(fault_broker, make_streamer, procs):
    supervisor = procs.supervisor(fault_broker, "pid_unless_hang", batch_size=4, hang_timeout=0.5)
    assert wait_for(lambda: len(worker_children(supervisor.pid)) == 1, 20), procs.log(supervisor)
    [stuck] = worker_children(supervisor.pid)
    wait_serving(procs, supervisor, [stuck])
    streamer = make_streamer(fault_broker, timeout=30)
    with pytest.raises(StreamerTimeoutError):
        streamer.predict(["hang"], timeout=1)
    # Without the watchdog every later call would time out as well, for good.
    [[text, pid]] = streamer.predict(["after"])
    assert text == "after" and pid != stuck and not alive(stuck)
    log = procs.log(supervisor, tail=None)
    assert "taken for hung" in log and "its model hung; restarting it" in log
    # Started again after hanging, a worker waits twice as long as its
    # group's hang_timeout, or twice its own if it answered nothing: a batch
    # that is only slow (a first call that compiles) ends up finishing.
    wait_serving(procs, supervisor, [pid])
    with pytest.raises(StreamerTimeoutError):
        streamer.predict(["hang"], timeout=1)  # it had answered "after": 1 s, then 2 x 0.5
    assert wait_for(lambda: set(worker_children(supervisor.pid)) - {stuck, pid}, 20), procs.log(supervisor)
    [third] = set(worker_children(supervisor.pid)) - {stuck, pid}
    wait_serving(procs, supervisor, [third])
    with pytest.raises(StreamerTimeoutError):
        streamer.predict(["hang"], timeout=1)  # answered nothing: 1 s, then 2 x 1
    assert wait_for(lambda: set(worker_children(supervisor.pid)) - {stuck, pid, third}, 20), procs.log(supervisor)
    [fourth] = set(worker_children(supervisor.pid)) - {stuck, pid, third}
    wait_serving(procs, supervisor, [fourth])
    with pytest.raises(StreamerTimeoutError):
        streamer.predict(["hang"], timeout=1)
    [[text, fifth]] = streamer.predict(["last"])
    assert fifth not in (stuck, pid, third, fourth)
    limits = re.findall(r"hang_timeout=([0-9.]+)s; raise it", procs.log(supervisor, tail=None))
    assert limits == ["0.5", "1", "1", "2"], procs.log(supervisor)


def test_run_redis_workers_forever_refuses_bad_options_before_starting_anything():
    from streamer_core import run_redis_workers_forever
    from tests.redis import models

    with pytest.raises(ValueError, match="worker_num"):
        run_redis_workers_forever(models.double, 4, worker_num=0)
    with pytest.raises(TypeError, match="cuda_devices"):
        run_redis_workers_forever(models.double, 4, cuda_devices={"gpu": 0})
    with pytest.raises(ValueError, match="claim_after"):
        run_redis_workers_forever(models.double, 4, claim_after=-1)
    with pytest.raises(ValueError, match="hang_timeout"):
        run_redis_workers_forever(models.double, 4, hang_timeout=0)
    with pytest.raises(TypeError, match="ManagedModel"):
        run_redis_workers_forever(object, 4)


def test_cli_sigterm_lets_the_batch_in_hand_finish_then_exits_0(fault_broker, make_streamer, procs, tmp_path):
    (tmp_path / "hold").write_text("")
    cli = procs.cli(
        fault_broker,
        "tests.redis.models:HoldModel",
        "--workers",
        "2",
        "--batch-size",
        "4",
        "--max-latency",
        "0.01",
        "--init-kwargs",
        json.dumps({"folder": str(tmp_path)}),
    )
    streamer = make_streamer(fault_broker, timeout=20)
    future = streamer.submit([5])
    assert wait_for(lambda: list(tmp_path.glob("inside-*")), 20), procs.log(cli)
    children = worker_children(cli.pid)
    assert len(children) == 2
    cli.send_signal(signal.SIGTERM)
    time.sleep(0.5)
    assert cli.poll() is None, "SIGTERM must wait for the batch in hand"
    (tmp_path / "hold").unlink()
    assert future.result(10) == [10]
    assert cli.wait(15) == 0, procs.log(cli)
    assert not any(alive(pid) for pid in children), "worker processes outlived the command"


def test_a_worker_whose_model_exits_with_any_code_once_serving_is_restarted(fault_broker, make_streamer, procs):
    """Exit status 3 is also what a worker whose model cannot load exits
    with; a worker that loaded its model and then exited with it (the
    model's own ``os._exit(3)``) was taken for one, not restarted, and the
    command gave up once each worker had met the input: every later call
    refused."""
    supervisor = procs.supervisor(
        fault_broker, "pid_unless_exit", batch_size=1, worker_num=2, claim_after=0.5, max_item_crashes=2
    )
    assert wait_for(lambda: len(worker_children(supervisor.pid)) == 2, 20), procs.log(supervisor)
    first = worker_children(supervisor.pid)
    wait_serving(procs, supervisor, first)
    streamer = make_streamer(fault_broker, timeout=20)
    with pytest.raises(StreamerError):
        streamer.predict(["exit"])  # kills each worker that takes it, until max_item_crashes
    assert "exited with 3; restarting it" in procs.log(supervisor, tail=None)
    assert wait_for(lambda: len(worker_children(supervisor.pid)) == 2, 20), procs.log(supervisor)
    wait_serving(procs, supervisor, worker_children(supervisor.pid))
    assert [x for x, _ in streamer.predict([1, 2])] == [1, 2]
    assert supervisor.poll() is None, procs.log(supervisor)
    assert "could not load" not in procs.log(supervisor, tail=None)


def test_cli_gives_up_on_a_model_that_cannot_load(fault_broker, procs):
    cli = procs.cli(fault_broker, "tests.redis.models:BrokenInitModel", "--workers", "2")
    try:
        code = cli.wait(30)
    except subprocess.TimeoutExpired:
        code = None
    log = procs.log(cli, tail=None)
    assert code not in (0, None), f"the command should fail once every worker failed to load:\n{log[-3000:]}"
    assert "weights.bin not found" in log
    assert log.count(") started on device") == 2, "workers whose model cannot load must not be restarted"


def test_cli_codec_pickle_serves_web_processes_that_chose_pickle(fault_broker, make_streamer, procs):
    from tests.redis.models import Point

    cli = procs.cli(fault_broker, "tests.redis.models:identity", "--codec", "pickle", "--max-latency", "0.01")
    streamer = make_streamer(fault_broker, codec="pickle", timeout=20)
    assert streamer.predict([Point(1, 2), {3, 4}]) == [Point(1, 2), {3, 4}], procs.log(cli)


def test_cli_refuses_a_model_it_cannot_import(fault_broker, procs):
    cli = procs.cli(fault_broker, "tests.redis.models:NoSuchModel")
    assert cli.wait(20) == 2
    assert "has no attribute 'NoSuchModel'" in procs.log(cli)


def test_cli_gives_each_worker_its_cuda_device(fault_broker, make_streamer, procs):
    cli = procs.cli(
        fault_broker,
        "tests.redis.models:EnvModel",
        "--workers",
        "4",
        "--devices",
        "0,1",
        "--batch-size",
        "2",
        "--max-latency",
        "0.01",
        "--init-kwargs",
        '{"tag": "emb", "delay": 0.05}',
    )
    assert wait_for(lambda: len(worker_children(cli.pid)) == 4, 30), procs.log(cli)
    pids = worker_children(cli.pid)
    wait_serving(procs, cli, pids)
    streamer = make_streamer(fault_broker, timeout=15)
    by_pid: dict = {}
    deadline = time.monotonic() + 20
    with ThreadPoolExecutor(16) as pool:
        while len(by_pid) < 4 and time.monotonic() < deadline:
            for [answer] in pool.map(lambda _: streamer.predict([0]), range(32)):
                by_pid[answer["pid"]] = answer
    assert set(by_pid) == set(pids), f"not every worker served: {sorted(by_pid)} of {pids}"
    for answer in by_pid.values():
        assert answer["cvd"] == str(answer["gpu_id"]), "CUDA_VISIBLE_DEVICES must be the worker's device"
        assert answer["tag"] == "emb", "--init-kwargs must reach init_model"
    assert Counter(a["cvd"] for a in by_pid.values()) == {"0": 2, "1": 2}


def test_workers_started_on_a_daemon_thread_stop_when_the_program_ends(broker, make_streamer, procs, tmp_path):
    """A program runs run_redis_workers_forever on a daemon thread and then
    ends, as service_streamer's own tests do. Its workers finish the batch in
    hand (its caller is answered), stop, and the program exits: no hang, no
    orphan. (Once, multiprocessing's exit handler joined the workers forever.)"""
    (tmp_path / "hold").write_text("")
    end = tmp_path / "end"
    program = procs.python(
        dict(mode="daemon", model="HoldModel", batch_size=4, max_latency=0.01, redis_broker=broker.url,
             prefix=broker.prefix, claim_after=0.5, model_init_kwargs={"folder": str(tmp_path)}, end=str(end)),
        name="daemon",
    )  # fmt: skip
    assert wait_for(lambda: len(worker_children(program.pid)) == 1, 20), procs.log(program)
    [worker] = worker_children(program.pid)
    streamer = make_streamer(broker, timeout=30)
    in_hand = streamer.submit([21])
    assert wait_for(lambda: list(tmp_path.glob("inside-*")), 20), procs.log(program)
    end.write_text("")
    assert wait_for(lambda: "the program ends" in procs.log(program), 5), procs.log(program)
    time.sleep(0.5)
    assert program.poll() is None, "the program should wait for the batch in hand"
    (tmp_path / "hold").unlink()
    assert in_hand.result(10) == [42], "the batch in hand at exit is finished and answered"
    assert program.wait(15) == 0, procs.log(program)
    assert wait_for(lambda: not alive(worker), 5), "a worker outlived the program"


def test_worker_log_lines_carry_their_level_and_say_when_the_model_is_ready(broker, procs):
    supervisor = procs.supervisor(broker, "with_pid", batch_size=4, worker_num=1)
    line = re.compile(
        r"streamer_core\.redis\[\d+\] INFO worker \S+ serving \S+: "
        r"model with_pid ready on cpu in \d+\.\d s \(batch size 4, max latency 0.01 s\)"
    )
    assert wait_for(lambda: line.search(procs.log(supervisor, tail=None)), 30), procs.log(supervisor)


def test_workers_do_not_outlive_a_killed_streamer_worker_command(broker, procs):
    """SIGKILL leaves the command no time to stop its workers: they notice
    their parent is gone and exit by themselves, within a second or two."""
    cli = procs.cli(broker, "tests.redis.models:double", "--workers", "2")
    assert wait_for(lambda: len(worker_children(cli.pid)) == 2, 30), procs.log(cli)
    # Killed once their models are loaded: a worker still starting (its
    # interpreter importing the app) watches its parent only from then on.
    assert wait_for(lambda: beating_workers(broker.url, broker.prefix) == 2, 30), procs.log(cli)
    pids = worker_children(cli.pid)
    os.kill(cli.pid, signal.SIGKILL)
    cli.wait(5)
    assert wait_for(lambda: not any(alive(pid) for pid in pids), 2), "workers outlived their killed command"


def test_cli_priority_levels_workers_read_every_levels_stream(broker, make_streamer, procs):
    """``streamer-worker --priority-levels 2 --priority-aging 0.5``, as the
    README runs it: its workers say they read two levels, and answer calls
    of both."""
    cli = procs.cli(broker, "tests.redis.models:double", "--priority-levels", "2", "--priority-aging", "0.5")
    streamer = make_streamer(broker, require_workers=True, priority_levels=2, timeout=20)
    assert streamer.wait_ready(30), procs.log(cli)
    assert wait_for(lambda: streamer._backend.roster.levels_read == 2, 10), procs.log(cli)
    assert streamer.predict([3], priority=2) == [6] and streamer.predict([4], priority=1) == [8]
