"""Large arrays to and from spawned workers through shared memory: the values
that arrive, where the model sees them, and that nothing is left in /dev/shm."""

from __future__ import annotations

import mmap
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from streamer_core import Streamer, WorkerDiedError
from streamer_core.backends.shared_memory import BlockPool, PeerBlocks, dump, load, new_prefix, shared_wire
from tests.core import models
from tests.helpers import run_program, wait_for

ROOT = Path(__file__).resolve().parents[2]
SHM = Path("/dev/shm")

pytestmark = pytest.mark.skipif(not SHM.is_dir(), reason="needs /dev/shm (Linux)")


def blocks_now() -> set:
    return {name for name in os.listdir(SHM) if name.startswith("sc")}


def test_large_arrays_reach_the_model_in_shared_memory_and_come_back(closing):
    streamer = closing(Streamer(models.describe_arrays, batch_size=8, max_latency=0.01))
    assert streamer.wait_ready(60)
    image = numpy.random.default_rng(0).random((3, 224, 224), dtype=numpy.float32)
    small = numpy.arange(16, dtype=numpy.int64)
    strided = numpy.arange(40_000, dtype=numpy.float64).reshape(200, 200)[:, ::2]  # not contiguous
    answers = streamer.predict([image, small, strided])
    for array, answer in zip([image, small, strided], answers):
        assert answer["dtype"] == str(array.dtype) and answer["shape"] == list(array.shape)
        assert answer["sum"] == pytest.approx(float(array.sum()), rel=1e-6)
        numpy.testing.assert_array_equal(answer["doubled"], array * 2)
        assert answer["doubled"].flags.writeable
    assert [answer["shared"] for answer in answers] == [True, False, False], (
        "a contiguous array over the threshold is seen in shared memory; a small or strided one comes by pipe"
    )


def test_an_input_is_copied_at_submit(closing):
    streamer = closing(Streamer(models.describe_arrays, batch_size=8, max_latency=0.01))
    assert streamer.wait_ready(60)
    array = numpy.ones(100_000, dtype=numpy.float32)
    future = streamer.submit([array])
    array[:] = 5  # the caller reuses its buffer at once, as a server reuses a decode buffer
    [answer] = future.result(30)
    assert answer["sum"] == 100_000.0


def test_threshold_and_turning_it_off(closing):
    array = numpy.ones(50_000, dtype=numpy.float32)  # 200 KB
    off = closing(Streamer(models.describe_arrays, batch_size=4, shared_memory_min_bytes=None))
    on_late = closing(Streamer(models.describe_arrays, batch_size=4, shared_memory_min_bytes=1 << 20))
    assert off.wait_ready(60) and on_late.wait_ready(60)
    before = blocks_now()
    assert off.predict([array])[0]["shared"] is False
    assert on_late.predict([array])[0]["shared"] is False
    assert blocks_now() == before, "with shared memory off (or the array under the threshold) no block is made"
    with pytest.raises(ValueError, match="shared_memory_min_bytes"):
        Streamer(models.describe_arrays, batch_size=4, shared_memory_min_bytes=0)


def test_cpu_tensors_cross_as_tensors(closing):
    torch = pytest.importorskip("torch")
    streamer = closing(Streamer(models.echo_tensors, batch_size=4, max_latency=0.01))
    assert streamer.wait_ready(60)
    tensor = torch.arange(60_000, dtype=torch.float32).reshape(300, 200)
    [(shared, result)] = streamer.predict([tensor])
    assert shared is True, "the worker should get a tensor viewing shared memory"
    assert type(result) is torch.Tensor and torch.equal(result, tensor + 1)


def test_a_dead_workers_blocks_are_unlinked(closing, tmp_path):
    streamer = closing(Streamer(models.big_arrays, batch_size=4, max_latency=0.01, max_item_crashes=1))
    assert streamer.wait_ready(60)
    before = blocks_now()
    for value in range(6):
        [result] = streamer.predict([value])
        assert result.shape == (256, 256) and result[0, 0] == value
    [pid] = streamer.worker_pids()
    made = blocks_now() - before
    assert made, "256 KB results should come back through the worker's blocks"
    marker = tmp_path / "in-model"
    future = streamer.submit([f"hold:{marker}"])  # the worker sleeps in the model, holding its blocks
    wait_for(marker.exists, 30)
    os.kill(pid, signal.SIGKILL)
    with pytest.raises(WorkerDiedError):
        future.result(30)
    assert not (blocks_now() & made), "the dead worker's blocks are still in /dev/shm"
    streamer.close()
    assert blocks_now() == before


LEAK_SCRIPT = """
import os, signal, sys, threading
from concurrent.futures import ThreadPoolExecutor
import numpy
from streamer_core import Streamer, StreamerError
from streamer_core.backends import process_backend
from tests.core import models

# The prefixes this process's streamer names its blocks with (the worker's
# too), so that blocks of tests running beside this one are not counted.
prefixes = []
made_by = process_backend.new_prefix

def recorded_prefix(tag):
    prefixes.append(made_by(tag))
    return prefixes[-1]

process_backend.new_prefix = recorded_prefix

def names():
    return {n for n in os.listdir("/dev/shm") if n.startswith(tuple(prefixes) or "sc")}

def main():
    calls = int(sys.argv[1])
    before = names()
    streamer = Streamer(models.double_arrays, batch_size=32, max_latency=0.005, max_item_crashes=1)
    assert streamer.wait_ready(60)
    most = [0]
    def client(index):
        array = numpy.full(4096, index, dtype=numpy.float32)  # 16 KB: through shared memory
        done = 0
        for seq in range(calls // 32):
            array[1] = seq
            if seq % 97 == 0:  # a call given up while queued or running
                streamer.submit([array]).cancel()
                continue
            if seq % 89 == 0:  # a call that times out
                try:
                    streamer.predict([array], timeout=0.0005)
                except StreamerError:
                    pass
                continue
            [out] = streamer.predict([array], timeout=30)
            assert out[0] == index * 2 and out[1] == seq * 2, (index, seq, out[:2])
            done += 1
            if seq % 500 == 0:
                most[0] = max(most[0], len(names() - before))
        return done
    with ThreadPoolExecutor(32) as pool:
        done = sum(pool.map(client, range(32)))
    [pid] = streamer.worker_pids()
    poison = numpy.full(4096, -1, dtype=numpy.float32)
    try:
        streamer.predict([poison], timeout=30)
    except StreamerError as exc:
        print("poison:", type(exc).__name__)
    streamer.wait_ready(60)
    assert pid not in streamer.worker_pids()
    [out] = streamer.predict([numpy.full(4096, 3, dtype=numpy.float32)], timeout=30)
    assert out[0] == 6
    streamer.close()
    assert prefixes, "the streamer made no block prefix: the test no longer sees its blocks"
    print("done", done, "most blocks", most[0], "left", sorted(names() - before))

if __name__ == "__main__":
    main()
"""


def test_nothing_is_left_behind_after_many_calls_and_a_killed_worker(tmp_path):
    script = tmp_path / "leak.py"
    script.write_text(textwrap.dedent(LEAK_SCRIPT))
    calls = 100_000
    result = run_program(script, str(calls), timeout=240)
    assert result.returncode == 0, result.stderr[-3000:]
    lines = result.stdout.splitlines()
    assert "poison: WorkerDiedError" in lines
    done_line = next(line for line in lines if line.startswith("done "))
    _, done, _, _, most, _, left = done_line.split(" ", 6)
    assert int(done) > calls * 0.9
    assert left == "[]", f"blocks left in /dev/shm: {left}"
    assert int(most) <= 200, f"blocks should be reused, yet {most} were in /dev/shm at once"
    assert "resource_tracker" not in result.stderr and "leaked" not in result.stderr, result.stderr[-3000:]


def test_dev_shm_full_falls_back_to_the_pipe(tmp_path):
    script = tmp_path / "full.py"
    script.write_text(
        textwrap.dedent(
            """
            import logging, resource, signal
            import numpy
            from streamer_core import Streamer
            from tests.core import models

            def main():
                logging.basicConfig(level=logging.WARNING)
                # No file (a shared memory block is one) may grow past 1 MB here:
                # a block for a 4 MB array cannot be made.
                signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
                resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, 1 << 20))
                streamer = Streamer(models.describe_arrays, batch_size=4)
                assert streamer.wait_ready(60)
                for _ in range(3):
                    [answer] = streamer.predict([numpy.ones(1 << 20, dtype=numpy.float32)])
                    assert answer["sum"] == 1 << 20 and answer["shared"] is False
                [answer] = streamer.predict([numpy.ones(1 << 16, dtype=numpy.float32)])  # 256 KB still fits
                assert answer["shared"] is True
                streamer.close()
                print("ok")

            if __name__ == "__main__":
                main()
            """
        )
    )
    result = run_program(script, timeout=120)
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr[-3000:]
    # Once in each process: the web process's inputs, the worker's results.
    assert result.stderr.count("shared memory is full") == 2, result.stderr[-3000:]
    assert "Traceback" not in result.stderr, result.stderr[-3000:]


arrays = hnp.arrays(
    dtype=st.sampled_from(["float32", "float64", "int8", "int64", "uint16", "bool", "complex64"]),
    shape=hnp.array_shapes(min_dims=0, max_dims=3, max_side=40),
)
values = st.recursive(
    arrays | st.integers() | st.text(max_size=5) | st.none(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=3), inner, max_size=3),
    max_leaves=8,
)


@settings(max_examples=150, deadline=None)
@given(value=values, min_bytes=st.sampled_from([1, 64, 4096]))
def test_dump_and_load_give_back_the_value(value, min_bytes):
    pool = BlockPool(new_prefix("t"), idle_bytes=1 << 20)
    peer = PeerBlocks()
    try:
        payload, blocks = dump(value, pool, min_bytes)
        wire = shared_wire(payload, blocks) if blocks else payload
        for copy in (True, False):
            _assert_same(load(wire, peer, copy=copy), value)
        peer.close()
        for block, _ in blocks:
            pool.give(block)
    finally:
        pool.close()


def _assert_same(got, expected):
    if isinstance(expected, numpy.ndarray):
        assert isinstance(got, numpy.ndarray) and got.dtype == expected.dtype
        numpy.testing.assert_array_equal(got, expected)
    elif isinstance(expected, list):
        assert isinstance(got, list) and len(got) == len(expected)
        for a, b in zip(got, expected):
            _assert_same(a, b)
    elif isinstance(expected, dict):
        assert got.keys() == expected.keys()
        for key in expected:
            _assert_same(got[key], expected[key])
    else:
        assert got == expected


def test_pools_with_one_prefix_in_two_processes_do_not_collide(tmp_path):
    """As after a fork of a process that made its pool (gunicorn --preload):
    the same prefix, a block each, both made."""
    prefix = new_prefix("fork")
    here = BlockPool(prefix)
    other = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys\n"
            "from streamer_core.backends.shared_memory import BlockPool\n"
            f"pool = BlockPool({prefix!r})\n"
            "block = pool.take(10000)\n"
            "print(block.name if block is not None else 'none', flush=True)\n"
            "sys.stdin.readline()\n"
            "pool.close()\n",
        ],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        theirs = other.stdout.readline().strip()
        mine = here.take(10000)
        assert theirs != "none" and mine is not None and mine.name != theirs
    finally:
        here.close()
        other.communicate("\n", timeout=30)
    assert not [name for name in os.listdir(SHM) if name.startswith(prefix)]


def test_a_block_given_back_is_reused_over_and_over_within_a_small_idle_limit():
    """A pool keeps the blocks given back up to ``idle_bytes`` and hands them
    out again: a hundred take-and-give rounds of one size make one block,
    however little room the limit leaves beyond it."""
    page = mmap.PAGESIZE
    pool = BlockPool(new_prefix("t"), idle_bytes=3 * page)
    try:
        names = set()
        for _ in range(100):
            block = pool.take(page)
            assert block is not None
            names.add(block.name)
            pool.give(block)
        assert len(names) == 1, f"{len(names)} blocks made for one in use at a time"
        assert pool.dropped() == []
    finally:
        pool.close()
