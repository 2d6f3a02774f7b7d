"""Priority levels through Django's batched views: each form of view (a
sync and an async function view, a class-based and an async class-based
view) serves one model at its own level or by a request header it allows;
a header that is not a level is a 400 before anything is queued; a view's
level that is not its model's is check ``django_streamer.E011``, and its
options are checked as it is declared."""

from __future__ import annotations

import json
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Tuple

import pytest
from django.core import checks
from django.test import Client

from django_streamer import BatchedView, batched_view, get_streamer
from tests.core.models import ran_batches
from tests.helpers import wait_for

RANKED = {"MODEL": "tests.core.models.RecordingGate", "BATCH_SIZE": 2, "MAX_LATENCY": 0.01, "PRIORITY_LEVELS": 2}
# (the project's settings have the model too, so that its views pass the checks)


@pytest.fixture
def pool() -> Iterator[ThreadPoolExecutor]:
    executor = ThreadPoolExecutor(8)
    yield executor
    executor.shutdown(wait=False, cancel_futures=True)


def _post(url: str, value: Any, headers: Optional[Dict[str, str]] = None) -> Any:
    return Client().post(url, json.dumps(value), content_type="application/json", headers=headers or {})


def test_each_form_of_view_queues_at_its_level_and_by_the_header_it_allows(streamer_settings, tmp_path, pool):
    streamer_settings(models={"ranked": dict(RANKED, INIT_KWARGS={"folder": str(tmp_path)})}, BACKEND="thread")
    (tmp_path / "hold").write_text("")
    held = pool.submit(_post, "/ranked-bulk", "hold")
    assert wait_for(lambda: (tmp_path / "inside").exists(), 10), "the held request never reached the model"
    streamer = get_streamer("ranked")
    ahead = streamer.submit(["ahead0", "ahead1"], priority=1)  # a full batch, handed ahead to the busy model
    assert wait_for(lambda: streamer.queued() == 0, 10)
    requests: List[Tuple[str, str, Dict[str, str]]] = [
        ("/ranked-bulk", "doc", {"X-Priority": "1"}),  # the view allows no header: its own level, 2
        ("/aranked-header", "default", {}),  # no header: the model's default, the lowest
        ("/aranked-header", "urgent", {"X-Priority": "1"}),
        ("/ranked-search", "query", {}),
        ("/ranked-named-header", "named", {"X-Request-Priority": "1"}),
    ]
    futures: List[Future[Any]] = []
    for url, value, headers in requests:
        futures.append(pool.submit(_post, url, value, headers))
        count = len(futures)
        assert wait_for(lambda n=count: streamer.queued() == n, 10), f"{value} was not queued"
    (tmp_path / "hold").unlink()
    assert [future.result(10).json() for future in futures] == [f"ok:{value}" for _, value, _ in requests]
    assert held.result(10).status_code == 200 and ahead.result(10) == ["ok:ahead0", "ok:ahead1"]
    batches = ran_batches(Path(tmp_path))
    after = batches[[i for i, batch in enumerate(batches) if "ahead0" in batch][0] + 1 :]
    assert after == [["urgent", "query"], ["named", "doc"], ["default"]]


@pytest.mark.parametrize(
    "url, header", [("/aranked-header", "X-Priority"), ("/ranked-named-header", "X-Request-Priority")]
)
def test_a_header_that_is_not_a_level_is_a_400_before_anything_is_queued(streamer_settings, tmp_path, url, header):
    streamer_settings(models={"ranked": dict(RANKED, INIT_KWARGS={"folder": str(tmp_path)})}, BACKEND="thread")
    for value in ("0", "3", "first", "2.0"):
        response = _post(url, "x", {header: value})
        assert response.status_code == 400, response.content
        error = response.json()["error"]
        assert f"the {header} header must be a whole number from 1 (the highest priority) to 2" in error["message"]
    # Checked before the body is read: a body that is no JSON gets the header's error all the same.
    response = Client().post(url, b"{not json", content_type="application/json", headers={header: "3"})
    assert response.status_code == 400 and f"the {header} header must be" in response.json()["error"]["message"]
    assert ran_batches(Path(tmp_path)) == [], "nothing reached the model"
    assert _post(url, "x", {header: "2"}).json() == "ok:x"


def test_e011_a_views_level_that_its_model_does_not_have(streamer_settings):
    streamer_settings(models={"ranked": dict(RANKED, PRIORITY_LEVELS=1, INIT_KWARGS={"folder": "/tmp"})})
    found = sorted(m.msg for m in checks.run_checks() if m.id == "django_streamer.E011")
    assert len(found) == 4, found
    assert "view at 'ranked-bulk' is 2, but its model has 1 priority level" in found[0]
    assert "STREAMER['MODELS']['ranked']['PRIORITY_LEVELS'] is 1" in found[0]
    assert "'aranked-header' lets requests choose their level by the X-Priority header" in found[1]
    assert "'ranked-named-header' lets requests choose their level by the X-Request-Priority header" in found[2]
    assert "'rest/ranked' lets requests choose their level by the X-Priority header" in found[3], "a DRF view's too"
    streamer_settings(models={"ranked": dict(RANKED, INIT_KWARGS={"folder": "/tmp"})})
    assert [m for m in checks.run_checks() if m.id == "django_streamer.E011"] == []


def test_view_priority_options_are_checked_as_the_view_is_declared():
    with pytest.raises(ValueError, match="priority of the batched view of 'ranked' must be a whole number >= 1"):
        batched_view("ranked", priority=0)
    with pytest.raises(TypeError, match="priority_header of the batched view of 'ranked' must be True"):
        batched_view("ranked", priority_header="X Priority")
    with pytest.raises(TypeError, match="priority of the batched view of 'ranked' must be a whole number"):
        BatchedView.as_view(model="ranked", priority="high")
