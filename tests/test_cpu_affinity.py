"""One core per web process: the examples' ``gunicorn.conf.py`` pin each
process to a core of its own once it has loaded its models (a process that
replaces a dead one takes its core), ``PIN_WORKERS=0`` leaves them free,
and the process backend's workers keep the cores their web process had
when its streamer was made, not the one it was pinned to since. Real
gunicorn, real spawned workers, the affinity read back from ``/proc``."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Dict, Iterator, List

import pytest

from streamer_core.web.affinity import free_core_index
from tests.helpers import stop_each, wait_for
from tests.servers import child_processes, free_port

ROOT = Path(__file__).resolve().parents[1]
CORES = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
needs_two_cores = pytest.mark.skipif(len(CORES) < 2, reason="needs two cores and os.sched_setaffinity")


def test_a_new_process_takes_the_first_core_index_no_live_process_holds() -> None:
    assert free_core_index([]) == 0
    assert free_core_index([0, 1, 2]) == 3
    assert free_core_index([0, 2, None]) == 1  # the process on core 1 died
    assert free_core_index([None, None]) == 0


def run_python(script: str) -> str:
    """What ``script`` prints, run by a fresh interpreter (pinning changes the process it runs in)."""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    return done.stdout


@needs_two_cores
def test_pin_to_core_pins_this_process_to_one_of_its_cores() -> None:
    out = run_python(
        "from streamer_core.web.affinity import pin_to_core; import os; "
        "print(pin_to_core(3), sorted(os.sched_getaffinity(0)))"
    )
    core, allowed = out.split(" ", 1)
    assert int(core) == CORES[3 % len(CORES)]
    assert allowed.strip() == f"[{core}]"


_PIN_WITH_THREADS = """
import os, threading
from streamer_core.web.affinity import pin_to_core
started, done = threading.Event(), threading.Event()
def wait():
    started.set()
    done.wait(30)
threads = [threading.Thread(target=wait) for _ in range(3)]  # started before the pin, as a server's are
for thread in threads:
    thread.start()
started.wait(10)
core = pin_to_core(1)
later = threading.Thread(target=lambda: print("later", sorted(os.sched_getaffinity(0))))
later.start(); later.join()
for tid in sorted(os.listdir("/proc/self/task")):
    try:
        print(tid, sorted(os.sched_getaffinity(int(tid))))
    except ProcessLookupError:  # "later", ended but still listed a moment
        pass
done.set()
print("core", core)
"""


@needs_two_cores
def test_pin_to_core_pins_every_thread_of_the_process() -> None:
    """Linux pins a thread, not a process: the threads a server started
    before pinning (its own, a streamer's) are pinned too, and so is one
    started after."""
    lines = run_python(_PIN_WITH_THREADS).split("\n")
    core = int(lines[-2].split()[1])
    allowed = [line.split(" ", 1)[1] for line in lines[:-2]]
    assert len(allowed) >= 5, lines  # the main thread, three started before, one after
    assert all(each == f"[{core}]" for each in allowed), lines


@needs_two_cores
@pytest.mark.parametrize(
    "backends, pinned",
    [
        (["thread", "redis"], False),  # one route's model computes here: every core stays
        (["redis", "process"], True),  # every model computes elsewhere
    ],
)
def test_settle_keeps_every_core_where_any_route_computes_here(backends: List[str], pinned: bool) -> None:
    """One web process of an app mixing backends, on a CPU without a GPU:
    ``settle`` pins it only where none of its routes' models computes here."""
    out = run_python(
        "import os; from types import SimpleNamespace; from streamer_core.web.gunicorn import settle; "
        "os.environ.pop('PIN_WORKERS', None); before = sorted(os.sched_getaffinity(0)); "
        "worker = SimpleNamespace(cfg=SimpleNamespace(workers=1), core_index=1, handle_quit=print); "
        f"settle(worker, {backends!r}); "
        "print(len(before), len(os.sched_getaffinity(0)))"
    )
    before, after = map(int, out.split())
    assert (after == 1) is pinned and (after == before) is not pinned, out


def test_one_core_cannot_be_pinned() -> None:
    out = run_python(
        "import os; os.sched_setaffinity(0, {min(os.sched_getaffinity(0))}); "
        "from streamer_core.web.affinity import pin_to_core; print(pin_to_core(1))"
    )
    assert out.strip() == "None"


def _allowed(pid: int) -> List[int]:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Cpus_allowed_list:"):
            allowed: List[int] = []
            for part in line.split(":", 1)[1].strip().split(","):
                low, _, high = part.partition("-")
                allowed.extend(range(int(low), int(high or low) + 1))
            return allowed
    raise AssertionError(f"no Cpus_allowed_list for {pid}")


@pytest.fixture
def gunicorn(tmp_path: Path) -> Iterator:
    started: List[subprocess.Popen] = []

    def start(env: Dict[str, str], workers: int = 2) -> subprocess.Popen:
        port = free_port()
        argv = [
            sys.executable, "-m", "gunicorn", "-c", "example_flask/gunicorn.conf.py", "-w", str(workers),
            "--bind", f"127.0.0.1:{port}", "tests.flask.warm_app:create_app()",
        ]  # fmt: skip
        full_env = {**os.environ, "PYTHONPATH": str(ROOT), "MARK_FOLDER": str(tmp_path), **env}
        with open(tmp_path / f"gunicorn-{len(started)}.log", "wb") as log:
            process = subprocess.Popen(
                argv, cwd=ROOT, env=full_env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        started.append(process)
        return process

    yield start
    stop_each(started)


def _booted(folder: Path, count: int) -> bool:
    return len(list(folder.glob("built-*"))) >= count


@needs_two_cores
def test_the_examples_pin_each_web_process_to_a_core_of_its_own(gunicorn, tmp_path: Path) -> None:
    """As many web processes as cores: each would have one anyway."""
    master = gunicorn({}, workers=len(CORES)) if len(CORES) == 2 else gunicorn({"PIN_WORKERS": "1"})
    assert wait_for(lambda: _booted(tmp_path, 2) and len(child_processes(master.pid)) == 2, 90), (
        tmp_path / "gunicorn-0.log"
    ).read_text()
    workers = child_processes(master.pid)
    assert wait_for(lambda: all(len(_allowed(pid)) == 1 for pid in workers), 30), [_allowed(p) for p in workers]
    cores = {pid: _allowed(pid)[0] for pid in workers}
    assert sorted(cores.values()) == CORES[:2], "two processes, the first two cores"

    gone = workers[0]
    os.kill(gone, signal.SIGKILL)
    assert wait_for(
        lambda: (
            gone not in child_processes(master.pid) and len(child_processes(master.pid)) == 2 and _booted(tmp_path, 3)
        ),
        90,
    )
    [new] = set(child_processes(master.pid)) - set(workers)
    assert wait_for(lambda: len(_allowed(new)) == 1, 30)
    assert _allowed(new) == [cores[gone]], "the new process takes the core of the one it replaced"


@needs_two_cores
def test_a_model_computing_on_this_cpu_keeps_every_core_while_cores_are_to_spare(gunicorn, tmp_path: Path) -> None:
    """One web process on the thread backend, no GPU: pinned, the model's
    threads would share one core; on the process backend its model
    computes in a worker, and the web process is pinned."""
    thread = gunicorn({}, workers=1)
    assert wait_for(lambda: _booted(tmp_path, 1) and len(child_processes(thread.pid)) == 1, 90)
    [web] = child_processes(thread.pid)
    time.sleep(1.0)  # post_worker_init, which would pin it, ran before the app was built: time enough to have pinned
    assert _allowed(web) == CORES
    os.killpg(thread.pid, signal.SIGKILL)
    thread.wait(10)

    process = gunicorn({"FLASK_STREAMER_BACKEND": "process", "FLASK_STREAMER_WORKER_NUM": "1"}, workers=1)
    assert wait_for(lambda: _booted(tmp_path, 2) and len(child_processes(process.pid)) == 1, 90)
    [web] = child_processes(process.pid)
    assert wait_for(lambda: len(_allowed(web)) == 1, 30), _allowed(web)


def test_pin_workers_must_say_1_0_or_auto(monkeypatch: pytest.MonkeyPatch) -> None:
    from streamer_core.web.affinity import pin_wanted

    monkeypatch.setenv("PIN_WORKERS", "yes")
    with pytest.raises(ValueError, match="PIN_WORKERS must be 1 .pin., 0 .do not. or auto"):
        pin_wanted(1, True)
    monkeypatch.setenv("PIN_WORKERS", "1")
    assert pin_wanted(1, True)
    monkeypatch.setenv("PIN_WORKERS", "0")
    assert not pin_wanted(64, False)


@needs_two_cores
def test_pin_workers_0_leaves_every_core_to_them(gunicorn, tmp_path: Path) -> None:
    master = gunicorn({"PIN_WORKERS": "0"})
    assert wait_for(lambda: _booted(tmp_path, 2) and len(child_processes(master.pid)) == 2, 90)
    for pid in child_processes(master.pid):
        assert _allowed(pid) == CORES


@needs_two_cores
def test_process_backend_workers_keep_the_cores_their_web_process_had_when_its_streamer_was_made() -> None:
    """The web process pins itself after its streamer started its worker;
    the worker, and the one that replaces it when it is killed, still run
    on every core."""
    script = textwrap.dedent(
        """
        import json, os, signal, time
        from streamer_core import Streamer
        from streamer_core.web.affinity import pin_to_core
        from tests.core.models import cores

        if __name__ == "__main__":
            streamer = Streamer(cores, batch_size=1, worker_num=1)
            assert streamer.wait_ready(30)
            pin_to_core(0)
            first = streamer.predict([1])[0]
            [pid] = streamer.worker_pids()
            os.kill(pid, signal.SIGKILL)
            deadline = time.monotonic() + 30
            while streamer.worker_pids() in ([], [pid]) and time.monotonic() < deadline:
                time.sleep(0.05)
            assert streamer.wait_ready(30)
            again = streamer.predict([1])[0]
            print(json.dumps({"parent": sorted(os.sched_getaffinity(0)), "first": first, "again": again}))
            streamer.close()
        """
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, cwd=ROOT, env=env
    )
    assert done.returncode == 0, done.stderr
    import json

    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["parent"] == [CORES[0]]
    assert report["first"] == CORES
    assert report["again"] == CORES, "the respawned worker took its web process's one core"


def test_only_the_thread_backend_computes_its_model_in_the_web_process_without_a_gpu() -> None:
    from streamer_core.web.affinity import model_computes_here

    assert not model_computes_here("process") and not model_computes_here("redis")
    torch = sys.modules.get("torch")
    on_gpu = torch is not None and torch.cuda.is_available()
    assert model_computes_here("thread") is (not on_gpu)
