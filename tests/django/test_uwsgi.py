"""The Django app under uWSGI, as Django sites often run it: several
processes with threads, forked from the master (the default) or each
loading the app itself (``--lazy-apps``). Concurrent requests to a batched
view share model calls within each process."""

from __future__ import annotations

import json
import sys
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Tuple

import pytest

from tests.helpers import wait_for
from tests.servers import free_port


def _post(url: str, data: Any) -> Tuple[int, Any]:
    request = urllib.request.Request(url, json.dumps(data).encode(), {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


@pytest.mark.parametrize("lazy", [False, True], ids=["forked-from-the-master", "lazy-apps"])
def test_under_uwsgi_concurrent_requests_share_model_calls(commands, lazy):
    port = free_port()
    uwsgi = str(Path(sys.executable).with_name("uwsgi"))
    args = ["--http-socket", f"127.0.0.1:{port}", "--module", "tests.django.wsgi:application", "--master",
            "--processes", "2", "--threads", "16", "--disable-logging", "--die-on-term"]  # fmt: skip
    server = commands.start(*args, *(["--lazy-apps"] if lazy else []), program=uwsgi)
    base = f"http://127.0.0.1:{port}"

    def up() -> bool:
        try:
            return _post(f"{base}/double", {"x": 1}) == (200, 2)
        except OSError:
            return False

    assert wait_for(up, 30, interval=0.1), commands.log(server)
    with ThreadPoolExecutor(24) as pool:
        answers = list(pool.map(lambda x: _post(f"{base}/sizes-cbv", {"x": x}), range(72)))
    assert [status for status, _ in answers] == [200] * 72, answers[:5]
    assert [x for _, (x, _) in answers] == list(range(72)), "every request gets its own answer"
    assert max(size for _, (_, size) in answers) > 1, f"no two requests shared a model call: {answers}"
    assert _post(f"{base}/double", {"x": "boom"})[0] == 500
