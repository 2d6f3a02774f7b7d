"""The overload rule's settings on a Flask app (``STREAMER_OVERLOAD_AFTER``,
``STREAMER_OVERLOAD_WAIT``) reach the streamer of every backend, and a call
it refuses is a 503 with ``Retry-After: 1``."""

from __future__ import annotations

from typing import Any, List

import pytest

from streamer_core import OverloadedError


@pytest.mark.parametrize("backend", ["thread", "redis"])
def test_the_overload_settings_reach_the_routes_streamer(make_app: Any, redis_url: str, backend: str) -> None:
    app, streamer = make_app(
        {
            "STREAMER_BACKEND": backend,
            "STREAMER_REDIS_URL": redis_url,
            "STREAMER_OVERLOAD_AFTER": 0.3,
            "STREAMER_OVERLOAD_WAIT": 0.7,
        }
    )
    streamer.add_batched_route("/echo", "echo", lambda batch: batch)
    config = streamer.get_streamer("echo", app)._config
    assert (config.overload_after, config.overload_wait) == (0.3, 0.7)


def test_a_call_the_overload_rule_refuses_is_a_503_with_retry_after(make_app: Any) -> None:
    app, streamer = make_app()

    def refused(request: Any) -> List[Any]:
        raise OverloadedError("the model is overloaded: this input waited 2.1s (overload_wait is 2s)")

    streamer.add_batched_route("/echo", "echo", lambda batch: batch, parse=refused)
    response = app.test_client().post("/echo", json=1)
    assert response.status_code == 503, response.get_data(as_text=True)
    assert response.headers["Retry-After"] == "1"
    error = response.get_json()["error"]
    assert error["type"] == "OverloadedError" and "overload_wait" in error["message"]
