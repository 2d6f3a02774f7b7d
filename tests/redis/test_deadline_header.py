"""A client's deadline header over Redis (``streamer_core.web.deadline``):
the call's timeout, read by the web process, travels with its request, and
a worker busy past it never runs the input, whoever holds it then."""

from __future__ import annotations

import threading
from typing import Any, List

from flask import Flask

from flask_streamer import FlaskStreamer
from tests.flask.conftest import close_streamers
from tests.helpers import beating_workers
from tests.redis import models
from tests.redis.conftest import wait_for


def test_an_input_past_its_clients_deadline_is_never_run_by_a_worker(broker, start_worker, gate) -> None:
    worker = start_worker(broker, gate, batch_size=4)
    app = Flask(f"deadline-{broker.prefix}")
    app.config.update(STREAMER_BACKEND="redis", STREAMER_REDIS_URL=broker.url, STREAMER_TIMEOUT=10)
    FlaskStreamer(app).add_batched_route("/gate", "gate", models.double, prefix=broker.prefix)
    answers: List[Any] = []
    try:
        assert wait_for(lambda: beating_workers(broker.url, broker.prefix) == 1, 10), "the worker never beat"
        held = threading.Thread(target=lambda: answers.append(app.test_client().post("/gate", json="hold")))
        held.start()
        assert gate.entered.wait(10), "the worker never took the held input"
        late = app.test_client().post("/gate", json="late", headers={"X-Request-Timeout": "0.3"})
        assert late.status_code == 504, late.get_data(as_text=True)
        assert "within its timeout of 0.3s" in late.get_json()["error"]["message"]
        gate.release()
        held.join(10)
        assert answers and answers[0].get_json() == "ok:hold"
        assert app.test_client().post("/gate", json="after").get_json() == "ok:after"
        assert gate.seen() == ["hold", "after"], "a worker ran an input past its client's deadline"
        assert wait_for(lambda: worker.worker.stats().dropped["expired"] == 1, 5), worker.worker.stats().dropped
    finally:
        gate.release()
        close_streamers(app)
