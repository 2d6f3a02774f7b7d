"""Instructions a served request costs the example's web process, counted
under valgrind: a measure of the serving layer's cost that, unlike CPU
time on a shared machine, moves little from one run to the next.

The Flask example runs under gunicorn with its own ``gunicorn.conf.py``
(with ``--trace-sample``, ``bench/apps/traced_gunicorn.py``: tracing on and
OpenTelemetry's SDK set up in the worker, recording that share of traces),
forward pass stubbed, the whole process tree under callgrind with counting
off. Once the model has loaded and ``--warmup`` requests have been served,
counting is switched on in the worker (``callgrind_control``); its count
is taken after ``--first`` requests and again after ``--then`` more, each
sent by ``--connections`` connections that wait for their answer. Printed:
instructions per request over each stretch. Model loading under valgrind
takes minutes.

Run from the repository root (valgrind from Debian's package)::

    .venv/bin/python -m bench.served_instructions
    .venv/bin/python -m bench.served_instructions --trace-sample 1      # every trace recorded
    .venv/bin/python -m bench.served_instructions --trace-sample 0.01   # one in a hundred
"""

from __future__ import annotations

import argparse
import glob
import http.client
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from typing import List, Optional, Sequence

from bench import harness

STUB_PATH = os.path.join(harness.REPO_ROOT, "bench", "apps", "stub_forward")
BODY = json.dumps({"s": "The quick brown fox jumps over the lazy dog near the river bank."})


def send(port: int, total: int, connections: int) -> int:
    """Send ``total`` requests over ``connections`` keep-alive connections;
    return how many were not answered 200."""
    left, bad, lock = [total], [0], threading.Lock()

    def one_connection() -> None:
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
        while True:
            with lock:
                if left[0] <= 0:
                    return
                left[0] -= 1
            connection.request("POST", "/stream", BODY, {"Content-Type": "application/json"})
            response = connection.getresponse()
            response.read()
            if response.status != 200:
                with lock:
                    bad[0] += 1

    threads = [threading.Thread(target=one_connection) for _ in range(connections)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return bad[0]


def answers(port: int) -> bool:
    """Whether the server answers a request to ``/stream`` (its model loaded)."""
    try:
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
        connection.request("POST", "/stream", BODY, {"Content-Type": "application/json"})
        return connection.getresponse().status == 200
    except OSError:
        return False


def served(port: int) -> float:
    """How many requests to ``/stream`` the worker has answered, by its
    ``/metrics``: what a count is divided by (a scrape costs the worker
    some millions of instructions, a few thousand a request of a stretch)."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    connection.request("GET", "/metrics")
    text = connection.getresponse().read().decode()
    found = re.findall(r'^streamer_requests_total\{model="stream",outcome="\w+"\} (\S+)$', text, re.MULTILINE)
    return sum(float(value) for value in found)


def counted(folder: str, pid: int, dumps_before: int) -> int:
    """The instruction count of the worker's newest dump, once it is written."""
    for _ in range(600):
        files = sorted(glob.glob(os.path.join(folder, f"cg.{pid}.*")), key=lambda name: int(name.rsplit(".", 1)[1]))
        if len(files) > dumps_before:
            with open(files[-1]) as dump:
                for line in dump:
                    if line.startswith(("summary:", "totals:")):
                        return int(line.split()[1])
        time.sleep(0.5)
    raise SystemExit("served_instructions: callgrind wrote no dump")


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--trace-sample", type=float, default=None, help="tracing on, this share of traces recorded")
    parser.add_argument("--warmup", type=int, default=300, help="requests before counting (default 300)")
    parser.add_argument("--first", type=int, default=300, help="requests of the first count (default 300)")
    parser.add_argument("--then", type=int, default=1200, help="requests of the second count (default 1200)")
    parser.add_argument("--connections", type=int, default=32, help="client connections (default 32)")
    parser.add_argument("--port", type=int, default=0, help="the server's port (default: a free one)")
    parser.add_argument("--keep", action="store_true", help="keep the dumps for callgrind_annotate")
    args = parser.parse_args(argv)
    args.port = args.port or harness.free_port()
    if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
        print("served_instructions: needs valgrind (apt-get install valgrind)", file=sys.stderr)
        return 2
    folder = tempfile.mkdtemp(prefix="served-instructions-")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([harness.REPO_ROOT, STUB_PATH]), TOKENIZERS_PARALLELISM="false")
    env.update(PIN_WORKERS="1", BIND=f"127.0.0.1:{args.port}", PYTHONUNBUFFERED="1", OPENBLAS_NUM_THREADS="1")
    conf = "example_flask/gunicorn.conf.py"
    if args.trace_sample is not None:
        env.update(FLASK_STREAMER_TRACING="true", BENCH_TRACE_SAMPLE=str(args.trace_sample))
        conf = "bench/apps/traced_gunicorn.py"
    command = [
        "valgrind", "--tool=callgrind", "--instr-atstart=no", "--trace-children=yes",
        f"--callgrind-out-file={folder}/cg.%p", sys.executable, "-m", "gunicorn", "--graceful-timeout", "900",
        "-c", conf, "example_flask:create_app()",
    ]  # fmt: skip
    with open(os.path.join(folder, "log"), "wb") as log:
        server = subprocess.Popen(command, cwd=harness.REPO_ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        for _ in range(1800):
            if answers(args.port):
                break
            time.sleep(1)
        else:
            raise SystemExit(f"served_instructions: the server did not answer; see {folder}/log")
        children = subprocess.run(["pgrep", "-P", str(server.pid)], capture_output=True, text=True).stdout.split()
        worker = int(children[0])
        send(args.port, args.warmup, args.connections)
        subprocess.run(["callgrind_control", "-z", str(worker)], capture_output=True, check=True)
        subprocess.run(["callgrind_control", "-i", "on", str(worker)], capture_output=True, check=True)
        results: List[str] = []
        for dumps, requests in enumerate((args.first, args.then)):
            before = served(args.port)
            bad = send(args.port, requests, args.connections)
            answered = served(args.port) - before
            subprocess.run(["callgrind_control", "-d", str(worker)], capture_output=True, check=True)
            count = counted(folder, worker, dumps)
            results.append(
                f"{requests} requests sent ({bad} not 200), {answered:.0f} answered: "
                f"{count / answered:,.0f} instructions a request answered"
            )
        label = "tracing off" if args.trace_sample is None else f"tracing on, {args.trace_sample:g} of traces recorded"
        print(f"the example's web process, forward pass stubbed, {label}:")
        for line in results:
            print("  " + line)
        os.kill(worker, signal.SIGKILL)
    finally:
        server.terminate()
        server.wait(120)
        if args.keep:
            print(f"callgrind's dumps: {folder} (cg.<worker pid>.1 and .2: callgrind_annotate reads each)")
        else:
            shutil.rmtree(folder, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
