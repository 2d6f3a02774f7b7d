"""The examples against service_streamer in a plain view, over HTTP, with the
real model: the deployment of issue #16, side by side, interleaved.

    apt-get install -y wrk
    .venv/bin/pip install -e '.[example,bench]'
    .venv/bin/python -m bench.web_bench --repeat 3          # about 15 minutes

Each variant runs under gunicorn, 1 process, ``-k gthread --threads 128``,
and wrk drives ``-t2 -c128`` POSTs of ``{"s": "<a 15-word sentence>"}`` at
``/stream``: 5 s of warm-up, then ``--duration`` seconds measured.

* ``flask-example``: ``example_flask`` as shipped (``@batched_route``, its
  settings, its ``gunicorn.conf.py``);
* ``flask-ss``: service_streamer 0.1.2's ``ThreadedStreamer`` in a plain
  Flask view (``bench/apps/web_apps.py``), batch 64, the same model;
* ``django-example`` and ``django-ss``: the same on Django;
* ``flask-core``, ``django-core`` (with ``--variants``): streamer_core's
  ``ThreadedStreamer`` in the plain views, to tell the layer from the engine.

With ``--variants flask-example-classify,flask-ss-classify`` (about 4
minutes), the tutorial of service_streamer instead: wrk uploads a JPEG of a
cat as multipart (``curl -F "file=@cat.jpg"``) to ``/classify``, the
example's EfficientNet-Lite0 route, against service_streamer's
``ThreadedStreamer`` in a plain Flask view of the same model, decoding the
upload the same way, batches of the same size (``flask-core-classify``: ours
in that view).

Shown: requests/s (median and range), the server's CPU per request (its
processes' user + system time over the run, from /proc), and each example
over its plain-view rival.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Dict, List, Optional, Tuple

from bench import harness
from bench.apps.http_app import SENTENCE

ROOT = Path(__file__).resolve().parents[1]
FLASK_EXAMPLE = ["-c", "example_flask/gunicorn.conf.py", "example_flask:create_app()"]
# name: gunicorn's options and app, the environment's additions, the route.
VARIANTS: Dict[str, Tuple[List[str], Dict[str, str], str]] = {
    "flask-example": (FLASK_EXAMPLE, {}, "/stream"),
    # The example with batches by count alone (no cost budget): a diagnostic.
    "flask-example-count": (
        FLASK_EXAMPLE,
        {"FLASK_STREAMER_ITEM_COST": "null", "FLASK_STREAMER_MAX_BATCH_COST": "null"},
        "/stream",
    ),
    "flask-ss": (["bench.apps.web_apps:flask_app()"], {}, "/stream"),
    "flask-core": (["bench.apps.web_apps:flask_app()"], {"BENCH_WEB_STREAMER": "core"}, "/stream"),
    "django-example": (["-c", "example_django/gunicorn.conf.py", "example_django.wsgi"], {}, "/stream"),
    "django-ss": (["bench.apps.web_apps:django_application"], {}, "/stream"),
    "django-core": (["bench.apps.web_apps:django_application"], {"BENCH_WEB_STREAMER": "core"}, "/stream"),
    # Images: a photo of a cat uploaded as multipart, classified by EfficientNet-Lite0.
    "flask-example-classify": (FLASK_EXAMPLE, {}, "/classify"),
    "flask-ss-classify": (["bench.apps.web_apps:flask_classify_app()"], {}, "/classify"),
    "flask-core-classify": (["bench.apps.web_apps:flask_classify_app()"], {"BENCH_WEB_STREAMER": "core"}, "/classify"),
}
# Each example against its rival, and the ratio issue #16 asks of it (None: none asked).
PAIRS: List[Tuple[str, str, Optional[float]]] = [
    ("flask-example", "flask-ss", 1.1),
    ("django-example", "django-ss", 1.1),
    ("flask-example-classify", "flask-ss-classify", None),
]
BODY = json.dumps({"s": SENTENCE})
BOUNDARY = "streamer-bench-7d4f1c"


def upload_body(folder: str) -> Tuple[str, str]:
    """A multipart body uploading a JPEG photo of a cat (scikit-image's
    ``chelsea``, 451 x 300) in the field ``file``, as ``curl -F
    "file=@cat.jpg"`` sends it: the file it is written to, and its type."""
    import io

    import skimage.data
    from PIL import Image

    photo = io.BytesIO()
    Image.fromarray(skimage.data.chelsea()).save(photo, "JPEG", quality=90)
    body = (
        (
            f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="file"; filename="cat.jpg"\r\n'
            "Content-Type: image/jpeg\r\n\r\n"
        ).encode()
        + photo.getvalue()
        + f"\r\n--{BOUNDARY}--\r\n".encode()
    )
    path = os.path.join(folder, "upload.bin")
    with open(path, "wb") as handle:
        handle.write(body)
    return path, f"multipart/form-data; boundary={BOUNDARY}"


def _post(url: str, body: bytes, content_type: str, timeout: float) -> int:
    request = urllib.request.Request(url, body, {"Content-Type": content_type})
    with urllib.request.urlopen(request, timeout=timeout) as response:
        return int(response.status)


def run_variant(name: str, args: argparse.Namespace, log_dir: str) -> Dict[str, float]:
    options, extra_env, route = VARIANTS[name]
    upload = upload_body(log_dir) if route == "/classify" else None
    if upload is None:
        body, content_type = BODY.encode(), "application/json"
    else:
        with open(upload[0], "rb") as handle:
            body, content_type = handle.read(), upload[1]
    port = harness.free_port()
    argv = [
        sys.executable, "-m", "gunicorn", *options[:-1], "-b", f"127.0.0.1:{port}", "-w", "1",
        "-k", "gthread", "--threads", "128", "--log-level", "warning", options[-1],
    ]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FLASK_", "STREAMER_", "WEB_", "BIND"))}
    env.update(extra_env, PYTHONPATH=str(ROOT), PYTHONUNBUFFERED="1")
    log = open(os.path.join(log_dir, f"{name}.log"), "ab")
    server = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=log, stderr=log, start_new_session=True)
    try:
        deadline = time.monotonic() + 180
        while True:
            try:
                if _post(f"http://127.0.0.1:{port}{route}", body, content_type, 60) == 200:
                    break
            except OSError:
                pass
            if server.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{name} did not start; see {log.name}")
            time.sleep(0.5)
        url = f"http://127.0.0.1:{port}{route}"
        harness.run_wrk(url, args.connections, args.warmup, 10, BODY, upload)
        ticks_before = harness.cpu_ticks(server.pid)
        summary, _ = harness.run_wrk(url, args.connections, args.duration, 10, BODY, upload)
        ticks = harness.cpu_ticks(server.pid) - ticks_before
        errors = summary["connect"] + summary["read"] + summary["write"] + summary["status"] + summary["timeout"]
        seconds = summary["duration_us"] / 1e6
        requests = summary["requests"]
        return {
            "rps": requests / seconds,
            "cpu_ms_per_request": ticks / os.sysconf("SC_CLK_TCK") / max(1, requests) * 1000,
            "p50_ms": summary["lat_p50_us"] / 1000,
            "p99_ms": summary["lat_p99_us"] / 1000,
            "errors": errors,
        }
    finally:
        try:
            os.killpg(server.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        server.wait(30)
        log.close()


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--variants", default="flask-example,flask-ss,django-example,django-ss")
    parser.add_argument("--repeat", type=int, default=3, help="runs of each variant, interleaved (default 3)")
    parser.add_argument("--duration", type=float, default=10.0, help="measured seconds per run (default 10)")
    parser.add_argument("--warmup", type=float, default=5.0, help="unmeasured seconds of load first (default 5)")
    parser.add_argument("--connections", type=int, default=128)
    args = parser.parse_args(argv)
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown:
        parser.error(f"unknown variants {unknown}; known: {', '.join(VARIANTS)}")
    runs: Dict[str, List[Dict[str, float]]] = {v: [] for v in variants}
    with tempfile.TemporaryDirectory(prefix="web-bench-") as log_dir:
        for r in range(args.repeat):
            for name in variants:
                result = run_variant(name, args, log_dir)
                runs[name].append(result)
                print(
                    f"run {r + 1}/{args.repeat} {name:15} {result['rps']:7.1f} req/s "
                    f"{result['cpu_ms_per_request']:.2f} CPU ms/request, p99 {result['p99_ms']:.0f} ms, "
                    f"errors {result['errors']:.0f}",
                    file=sys.stderr,
                )
    medians = {name: statistics.median(r["rps"] for r in results) for name, results in runs.items()}
    print(f"\ngunicorn -w 1 -k gthread --threads 128, wrk -c{args.connections}, {args.duration:g} s runs, "
          f"median of {args.repeat} interleaved")  # fmt: skip
    print("| variant | req/s (median) | range | server CPU ms per request | p99 ms | errors |")
    print("|---|--:|--:|--:|--:|--:|")
    for name, results in runs.items():
        rates = [r["rps"] for r in results]
        cpu = statistics.median(r["cpu_ms_per_request"] for r in results)
        p99 = statistics.median(r["p99_ms"] for r in results)
        errors = sum(r["errors"] for r in results)
        spread = f"{min(rates):.0f}-{max(rates):.0f}"
        print(f"| {name} | {medians[name]:.0f} | {spread} | {cpu:.2f} | {p99:.0f} | {errors:.0f} |")
    for ours, theirs, target in PAIRS:
        if ours in medians and theirs in medians:
            asked = f" (target >= {target}x)" if target is not None else ""
            print(f"\n{ours} / {theirs}: {medians[ours] / medians[theirs]:.2f}x{asked}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
