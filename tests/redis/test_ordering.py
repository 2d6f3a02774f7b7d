"""One queue for every web process: first in, first out across web servers,
and many web processes with many workers answer every call exactly once."""

from __future__ import annotations

import json
from collections import Counter

from tests.redis.conftest import wait_serving


def test_first_in_first_out_across_web_servers(broker, make_streamer, start_worker):
    """Two web servers (two streamers, each with its own result stream)
    submit interleaved calls while no worker runs; the worker, started
    afterwards, sees them in submission order, within and across batches."""
    web_a, web_b = make_streamer(broker), make_streamer(broker)
    futures, order = [], []
    for i in range(12):
        streamer, name = (web_a, "a") if i % 2 == 0 else (web_b, "b")
        item = f"{name}{i}"
        futures.append(streamer.submit([item]))
        order.append(item)
        broker.wait_queued(i + 1)  # in Redis before the next one is submitted
    seen: list = []

    def model(batch: list) -> list:
        seen.extend(batch)
        return [x.upper() for x in batch]

    start_worker(broker, model, batch_size=5, max_latency=0.05)
    assert [f.result(10) for f in futures] == [[x.upper()] for x in order]
    assert seen == order, "the worker did not run the calls in the order they were made"


def test_a_multi_input_call_is_queued_in_input_order_behind_earlier_calls(broker, make_streamer, start_worker):
    streamer = make_streamer(broker)
    first = streamer.submit(["x"])
    broker.wait_queued(1)
    second = streamer.submit(list("abcdefg"))
    broker.wait_queued(8)
    seen: list = []

    def model(batch: list) -> list:
        seen.extend(batch)
        return batch

    start_worker(broker, model, batch_size=3, max_latency=0.05)
    assert first.result(10) == ["x"] and second.result(10) == list("abcdefg")
    assert seen == list("xabcdefg")


def test_two_web_processes_and_two_workers_answer_every_call_exactly_once(broker, procs, tmp_path):
    records = tmp_path / "records"
    records.mkdir()
    workers = [
        procs.worker(
            broker,
            "RecordModel",
            batch_size=4,
            max_latency=0.005,
            model_init_kwargs={"folder": str(records), "delay": 0.005},
        )
        for _ in range(2)
    ]
    for w in workers:
        wait_serving(procs, w, [w.pid])
    threads, calls = 4, 25
    webs = [
        procs.python(
            dict(mode="web", url=broker.url, prefix=broker.prefix, name=name, threads=threads, calls=calls),
            name=f"web-{name}",
            capture_stdout=True,
        )
        for name in ("w1", "w2")
    ]
    reports = []
    for web in webs:
        out, _ = web.communicate(timeout=60)
        assert web.returncode == 0, procs.all_logs()
        reports.append(json.loads(out))
    per_process = threads * sum(1 + i % 3 for i in range(calls))
    for report in reports:
        assert report["problems"] == [], report["problems"][:5]
        assert report["answered"] == per_process
    # What the workers ran: every input exactly once, and both workers ran some.
    ran = Counter()
    by_worker = {}
    for log in records.glob("*.jsonl"):
        lines = [json.loads(line) for line in log.read_text().splitlines()]
        by_worker[int(log.stem)] = len(lines)
        ran.update(lines)
    sent = Counter(x for report in reports for x in report["sent"])
    assert ran == sent, (
        f"inputs run twice: {[x for x, n in ran.items() if n > 1][:5]}; never run: {list((sent - ran).keys())[:5]}"
    )
    assert set(by_worker) == {w.pid for w in workers}, f"not every worker ran inputs: {by_worker}"
    answered_by = {pid for report in reports for pid in report["pids"]}
    assert answered_by == {w.pid for w in workers}
    assert broker.xlen() == 0 and broker.pending() == 0, "answered requests must leave the stream"
    assert broker.result_keys() == [], "closed web processes must leave no result stream behind"
