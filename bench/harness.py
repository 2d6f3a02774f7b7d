"""What the benchmarks share to start, watch and measure what they drive:
free ports, process groups (started, counted, killed), the CPU a process
tree spent (from /proc), wrk runs, a private redis-server, and how figures
are summed up and judged against their targets (PASS/MISS, never asserted).
"""

from __future__ import annotations

import json
import math
import os
import re
import resource
import signal
import socket
import subprocess
import time
from typing import Any, Dict, List, Optional, Sequence, Set, Tuple

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
#: The Lua script wrk runs: it posts a body and prints a JSON summary.
LUA_SCRIPT = os.path.join(REPO_ROOT, "bench", "http_post.lua")

# Time limits, in seconds.
SERVER_START_LIMIT_S = 10.0
SERVER_STOP_LIMIT_S = 5.0

# Every process group this process started and has not seen end (Popen objects).
LIVE: Set[subprocess.Popen] = set()


# -- ports and processes ------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def machine_busy_ticks() -> int:
    """Clock ticks every CPU of the machine spent busy (not idle, not iowait)."""
    with open("/proc/stat") as handle:
        fields = [int(v) for v in handle.readline().split()[1:]]
    return sum(fields) - fields[3] - fields[4]


#: Clock ticks a second, the unit of /proc's CPU times.
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def cpu_ticks(root_pid: int) -> int:
    """utime + stime, in clock ticks, of ``root_pid`` and every descendant
    (gunicorn's worker is a child of its arbiter)."""
    return sum(cpu_ticks_by_depth(root_pid))


def cpu_ticks_by_depth(root_pid: int, deepest: int = 2) -> List[int]:
    """utime + stime, in clock ticks, of ``root_pid``'s process tree, by
    depth: ``[the root, its children, ..., deepest and below]``. Under
    gunicorn: the arbiter, the web workers, what they spawned (the process
    backend's model workers). Only live processes count."""
    children: Dict[int, List[int]] = {}
    ticks: Dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as handle:
                stat = handle.read()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()  # after "pid (comm) "
        pid = int(entry)
        children.setdefault(int(fields[1]), []).append(pid)
        ticks[pid] = int(fields[11]) + int(fields[12])
    totals = [0] * (deepest + 1)
    todo = [(root_pid, 0)]
    while todo:
        pid, depth = todo.pop()
        totals[min(depth, deepest)] += ticks.get(pid, 0)
        todo.extend((child, depth + 1) for child in children.get(pid, []))
    return totals


def group_members(pgid: int) -> List[int]:
    """Live (not zombie) processes in process group ``pgid``, from /proc."""
    members = []
    try:
        names = os.listdir("/proc")
    except OSError:
        return members
    for name in names:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as handle:
                stat = handle.read()
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2 :].split()  # state, ppid, pgrp, ...
        if len(fields) > 2 and fields[0] != "Z" and int(fields[2]) == pgid:
            members.append(int(name))
    return members


def command_line(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            return handle.read().replace(b"\0", b" ").decode(errors="replace").strip()[:200]
    except OSError:
        return f"pid {pid}"


def kill(proc: subprocess.Popen) -> None:
    """SIGKILL ``proc``'s process group (it leads one) and reap ``proc``."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        proc.wait(SERVER_STOP_LIMIT_S)
    except subprocess.TimeoutExpired:  # pragma: no cover - a SIGKILLed process is reaped at once
        pass
    LIVE.discard(proc)


def kill_everything_left() -> None:
    for proc in list(LIVE):
        kill(proc)


def tail(path: str, size: int = 2000) -> str:
    try:
        with open(path, errors="replace") as handle:
            return handle.read()[-size:]
    except OSError:
        return ""


# -- a private Redis -------------------------------------------------------------------


class PrivateRedis:
    """A ``redis-server`` of this run only: a free port, no persistence, its
    files in ``directory``; in a process group of its own."""

    def __init__(self, executable: str, directory: str) -> None:
        self.executable = executable
        self.directory = directory
        self.port = 0
        self.proc: Optional[subprocess.Popen] = None

    def start(self) -> None:
        import redis

        for _ in range(5):  # another program may take the free port first
            with socket.socket() as probe:
                probe.bind(("127.0.0.1", 0))
                port = probe.getsockname()[1]
            log_path = os.path.join(self.directory, f"redis-{port}.log")
            with open(log_path, "w") as log:
                proc = subprocess.Popen(
                    [self.executable, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                     "--dir", self.directory, "--daemonize", "no"],
                    stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
                )  # fmt: skip
            LIVE.add(proc)
            deadline = time.monotonic() + SERVER_START_LIMIT_S
            while time.monotonic() < deadline and proc.poll() is None:
                try:
                    redis.Redis(host="127.0.0.1", port=port, socket_timeout=1.0).ping()
                except redis.RedisError:
                    time.sleep(0.05)
                    continue
                self.port, self.proc = port, proc
                return
            kill(proc)
            if "Address already in use" not in tail(log_path):
                raise RuntimeError(f"redis-server did not start on port {port}: {tail(log_path, 500)}")
        raise RuntimeError("redis-server: no free port found in 5 tries")

    def client(self) -> Any:
        import redis

        return redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=2.0)

    def leftovers(self, library: str, prefix: str) -> str:
        """What a run left under its prefix, once every side has stopped
        ("" when nothing): requests not taken or not acknowledged, result
        streams nobody reads."""
        try:
            conn = self.client()
            if library == "theirs":
                queued = conn.llen(f"request_queue{prefix}")
                return f"{queued} requests queued" if queued else ""
            namespace = f"streamer:{prefix}" if prefix else "streamer"
            parts = []
            requests_key = f"{namespace}:requests"
            if conn.exists(requests_key):
                entries = conn.xlen(requests_key)
                pending = conn.xpending(requests_key, "workers")["pending"] if entries else 0
                if entries:
                    parts.append(f"{entries} requests ({pending} unacked)")
            results = [key for key in conn.scan_iter(match=f"{namespace}:results:*", count=1000)]
            if results:
                parts.append(f"{len(results)} results stream(s), {sum(conn.xlen(k) for k in results)} entries")
            return ", ".join(parts)
        except Exception as exc:  # the report must not fail on this
            return f"could not check: {type(exc).__name__}: {exc}"

    def stop(self) -> None:
        """SIGTERM (nothing to save), then SIGKILL past the limit."""
        proc = self.proc
        if proc is None:
            return
        self.proc = None
        try:
            proc.terminate()
            proc.wait(SERVER_STOP_LIMIT_S)
        except subprocess.TimeoutExpired:
            pass
        kill(proc)


# -- wrk ---------------------------------------------------------------------------------

_RESULT_LINE = re.compile(r"^BENCH_RESULT (\{.*\})\s*$", re.MULTILINE)


def run_wrk(
    url: str, connections: int, duration_s: float, timeout_s: float, body: str, upload: Optional[Tuple[str, str]] = None
) -> Tuple[Dict[str, Any], float]:
    """Run wrk once; its summary (from the Lua ``done`` hook) and its CPU
    seconds. ``upload``: (a file holding the body, its content type), sent
    instead of the JSON ``body``."""
    command = [
        "wrk",
        f"-t{min(2, connections)}",
        f"-c{connections}",
        f"-d{max(1, round(duration_s))}s",
        f"--timeout={max(1, round(timeout_s))}s",
        "-s",
        LUA_SCRIPT,
        url,
    ]
    env = dict(os.environ, BENCH_HTTP_BODY=body)
    if upload is not None:
        env.update(BENCH_HTTP_BODY_FILE=upload[0], BENCH_HTTP_CONTENT_TYPE=upload[1])
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=duration_s + timeout_s + 30)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu_s = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    match = _RESULT_LINE.search(done.stdout)
    if done.returncode != 0 or match is None:
        raise RuntimeError(f"wrk exited {done.returncode}: {(done.stdout + done.stderr).strip()[-500:]}")
    return json.loads(match.group(1)), cpu_s


# -- figures -----------------------------------------------------------------------------


def percentile(sorted_values: Sequence[float], pct: float) -> Optional[float]:
    """Nearest-rank percentile of an already sorted sequence (``None`` if empty)."""
    if not sorted_values:
        return None
    rank = max(1, math.ceil(pct / 100.0 * len(sorted_values)))
    return sorted_values[rank - 1]


def verdict(value: Optional[float], target: float, at_least: bool) -> str:
    if value is None:
        return "n/a"
    ok = value >= target if at_least else value <= target
    return f"{value:.2f} {'PASS' if ok else 'MISS'}"
