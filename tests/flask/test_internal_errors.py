"""What a 500 tells the client: ``internal error`` and an id, the id on
the log line that carries the traceback; the exception's type and message
only where the app asks (``STREAMER_ERROR_DETAILS``, by default its debug
mode). A 4xx keeps saying what was wrong."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from tests.flask.apps import fail_on_boom
from tests.flask.conftest import error_of
from tests.helpers import failure_behind


def test_a_500_says_internal_error_and_an_id_the_log_line_carries(make_app, caplog):
    app, streamer = make_app()
    streamer.add_batched_route("/boom", model=fail_on_boom)
    client = app.test_client()
    with caplog.at_level(logging.ERROR):
        first = error_of(client.post("/boom", json="boom"), 500)
        second = error_of(client.post("/boom", json="boom"), 500)
    assert set(first) == {"status", "type", "message", "id"}
    assert (first["type"], first["message"]) == ("internal_error", "internal error")
    assert first["id"] != second["id"], "each failure has an id of its own"
    failure = failure_behind(first, caplog.records)
    assert (type(failure), str(failure)) == (ValueError, "the model cannot take 'boom'")
    (line,) = [r for r in caplog.records if first["id"] in r.getMessage()]
    assert line.getMessage() == f"the batched route fail_on_boom failed (error id {first['id']})"
    # A client's own mistake still says what it was.
    assert "not valid JSON" in error_of(client.post("/boom", data="{", content_type="application/json"), 400)["message"]


@pytest.mark.parametrize(
    ("setting", "debug", "shown", "traceback"),
    [
        (None, False, False, False),
        (None, True, True, True),
        (True, False, True, False),
        (False, True, False, False),
    ],
)
def test_the_details_are_said_where_the_app_asks(make_app, setting: Any, debug: bool, shown: bool, traceback: bool):
    app, streamer = make_app({} if setting is None else {"STREAMER_ERROR_DETAILS": setting})
    app.debug = debug
    streamer.add_batched_route("/boom", model=fail_on_boom)
    error = error_of(app.test_client().post("/boom", json="boom"), 500)
    said = (error["type"], error["message"])
    assert said == (("ValueError", "the model cannot take 'boom'") if shown else ("internal_error", "internal error"))
    assert ("traceback" in error) is traceback
    assert len(error["id"]) == 16


def test_a_setting_that_is_not_a_flag_or_none_is_refused(make_app):
    from streamer_core.errors import ConfigurationError

    with pytest.raises(ConfigurationError, match="STREAMER_ERROR_DETAILS must be True or False"):
        make_app({"STREAMER_ERROR_DETAILS": "yes"})
