"""One command for a GPU box: the GPU tests, the scale benchmark sized to the
box, and a short markdown report of both.

    .venv/bin/python -m bench.gpu_report                 # tests/gpu, then scale_bench: about 20 minutes
    .venv/bin/python -m bench.gpu_report --tests-only    # tests/gpu alone: a few minutes
    .venv/bin/python -m bench.gpu_report --out report.md --repeat 2

What it writes (``--out``, default ``bench/results/gpu-report-<date>.md``;
``bench/results/`` is git-ignored): the date, the GPUs (name, memory,
driver, from ``nvidia-smi`` where it is on ``PATH``, else from torch), the
versions of Python, torch and its CUDA, the cores; each test of
``tests/gpu`` with its outcome (and why it failed or was skipped); and
``bench/scale_bench.py``'s tables for the real model, for the stubbed
forward pass and for ``/classify`` (``--images``, at most eight web
processes, issue #30's floors), with the command that made each, sized to
the box: half the cores as web processes, one model worker per GPU on the Redis backend
(``--devices`` every GPU). It exits 1 if a GPU test failed, 2 if the
machine has no CUDA device torch can use.

On a machine without network, install from a copy (``../shared/GPU.md``
lists what a bare box lacks, ``../shared/gpu/prep.sh`` builds it): the
project's ``test`` and ``example`` extras' packages, service_streamer for
the comparison, ``wrk`` and ``redis-server`` on ``PATH``, and the two model
packages (or their weights; see the README's "On a GPU box").
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ElementTree
from typing import Dict, List, Optional, Sequence, Tuple

from bench import harness

TEST_LIMIT_S = 1800  # every GPU test, models loading on a cold box included
BENCH_LIMIT_S = 3600


def machine() -> Tuple[List[str], int]:
    """Lines saying what this box is, and how many CUDA devices torch sees."""
    import torch

    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    lines = [
        f"- Python {platform.python_version()}, torch {torch.__version__} (CUDA {torch.version.cuda}), "
        f"{os.cpu_count()} cores, {platform.platform()}"
    ]
    smi = shutil.which("nvidia-smi")
    if smi:
        query = "--query-gpu=index,name,memory.total,driver_version"
        done = subprocess.run([smi, query, "--format=csv,noheader"], capture_output=True, text=True, timeout=60)
        lines += [f"- GPU {line.strip()}" for line in done.stdout.splitlines() if line.strip()]
    else:
        for i in range(count):
            properties = torch.cuda.get_device_properties(i)
            lines.append(f"- GPU {i}, {properties.name}, {properties.total_memory / 2**30:.0f} GiB (no nvidia-smi)")
    return lines, count


def run_gpu_tests(folder: str) -> Tuple[List[Tuple[str, str, str]], str]:
    """``tests/gpu`` under pytest: each test's name, outcome and message,
    and the command that ran them."""
    xml = os.path.join(folder, "gpu-tests.xml")
    command = [sys.executable, "-m", "pytest", "tests/gpu", "-q", "-p", "no:cacheprovider", f"--junitxml={xml}"]
    subprocess.run(command, cwd=harness.REPO_ROOT, timeout=TEST_LIMIT_S)
    rows: List[Tuple[str, str, str]] = []
    if not os.path.exists(xml):
        return [("tests/gpu", "error", "pytest wrote no report")], " ".join(command[1:])
    for case in ElementTree.parse(xml).getroot().iter("testcase"):
        name = f"{case.get('classname', '').rsplit('.', 1)[-1]}::{case.get('name')}"
        outcome, message = "passed", ""
        for kind in ("failure", "error", "skipped"):
            found = case.find(kind)
            if found is not None:
                outcome = {"failure": "FAILED", "error": "ERROR", "skipped": "skipped"}[kind]
                text = (found.get("message") or found.text or "").strip()
                message = text.splitlines()[0][:200] if text else ""
                break
        rows.append((name, outcome, message))
    return rows, "python " + " ".join(command[1:-1])


def run_scale_bench(extra: List[str]) -> Tuple[str, str]:
    """``bench.scale_bench`` with ``extra``: its table and its command."""
    command = [sys.executable, "-m", "bench.scale_bench", *extra]
    done = subprocess.run(
        command, cwd=harness.REPO_ROOT, capture_output=True, text=True, timeout=BENCH_LIMIT_S
    )  # fmt: skip
    out = done.stdout
    table = out[out.index("scale_bench:") :] if "scale_bench:" in out else (out + done.stderr)[-3000:]
    return table.strip(), "python -m bench.scale_bench " + " ".join(extra)


def render(
    when: str, about: List[str], tests: List[Tuple[str, str, str]], test_command: str, benches: List[Tuple[str, str]]
) -> str:
    counts: Dict[str, int] = {}
    for _, outcome, _ in tests:
        counts[outcome] = counts.get(outcome, 0) + 1
    lines = [f"# GPU report, {when}", "", *about, "", f"## tests/gpu: {counts}", "", f"`{test_command}`", ""]
    lines += ["| test | outcome | why |", "| --- | --- | --- |"]
    lines += [f"| {name} | {outcome} | {message.replace('|', '/')} |" for name, outcome, message in tests]
    for table, command in benches:
        lines += ["", "## Scale benchmark", "", f"`{command}`", "", table]
    return "\n".join(lines) + "\n"


def parse_args(argv: Optional[Sequence[str]]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.gpu_report", description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="", help="the report's path (default bench/results/gpu-report-DATE.md)")
    parser.add_argument("--tests-only", action="store_true", help="run tests/gpu, not the benchmark")
    parser.add_argument("--repeat", type=int, default=1, help="scale_bench's --repeat (default 1)")
    parser.add_argument("--duration", type=float, default=8.0, help="scale_bench's --duration (default 8)")
    parser.add_argument(
        "--web-workers", type=int, default=0, help="scale_bench's --web-workers (default: half the cores)"
    )
    return parser.parse_args(argv)


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    try:
        about, gpus = machine()
    except ImportError:
        print("gpu_report: torch is not installed (pip install -e '.[test,example]')", file=sys.stderr)
        return 2
    if gpus == 0:
        print("gpu_report: torch sees no CUDA device here; run it on a GPU box", file=sys.stderr)
        return 2
    started = time.monotonic()
    when = datetime.datetime.now().strftime("%Y-%m-%d %H:%M")
    with tempfile.TemporaryDirectory(prefix="gpu-report-") as folder:
        print("gpu_report: tests/gpu ...", file=sys.stderr, flush=True)
        tests, test_command = run_gpu_tests(folder)
    benches: List[Tuple[str, str]] = []
    if not args.tests_only:
        web = args.web_workers or max(1, (os.cpu_count() or 2) // 2)
        sized = ["--web-workers", str(web), "--model-workers", str(gpus), "--devices", ",".join(map(str, range(gpus)))]
        sized += ["--repeat", str(args.repeat), "--duration", f"{args.duration:g}"]
        # /classify at issue #30's eight web processes (fewer on a smaller box).
        images = [*sized, "--images", "--web-workers", str(min(8, web))]
        for extra in (sized, [*sized, "--stub-forward", "--variants", "ours-thread,ours-redis"], images):
            print(f"gpu_report: scale_bench {' '.join(extra)} ...", file=sys.stderr, flush=True)
            benches.append(run_scale_bench(extra))
    text = render(when, about, tests, test_command, benches)
    text += f"\n(made by `python -m bench.gpu_report` in {time.monotonic() - started:.0f} s)\n"
    out = args.out or os.path.join(harness.REPO_ROOT, "bench", "results", f"gpu-report-{when[:10]}.md")
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    with open(out, "w") as handle:
        handle.write(text)
    print(text)
    print(f"gpu_report: written to {out}", file=sys.stderr)
    return 1 if any(outcome in ("FAILED", "ERROR") for _, outcome, _ in tests) else 0


if __name__ == "__main__":
    sys.exit(main())
