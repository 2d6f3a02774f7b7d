"""The streamer semantics users rely on, over Redis: results in caller
order, errors isolated to the input that caused them, clear errors for
wrong-length results, per-call timeouts, closing, and a bounded queue."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from streamer_core import (
    BatchLengthError,
    BrokerUnavailableError,
    ConfigurationError,
    QueueFullError,
    RedisStreamer,
    RedisWorker,
    RemoteError,
    RemoteTraceback,
    StreamerClosedError,
    StreamerTimeoutError,
    UnavailableError,
    WorkerStartError,
)
from streamer_core.options.config import MAX_SECONDS
from tests.helpers import close_answers_every_call, hold_answers
from tests.redis import models
from tests.redis.conftest import wait_for


class Recorder:
    """A model for a thread worker: records each batch, doubles each input."""

    def __init__(self) -> None:
        self.batches: list = []

    def __call__(self, batch: list) -> list:
        self.batches.append(list(batch))
        return [x * 2 for x in batch]

    def seen(self) -> list:
        return [x for batch in self.batches for x in batch]


def test_a_call_spread_over_several_batches_gets_its_results_in_order(broker, make_streamer, start_worker):
    model = Recorder()
    start_worker(broker, model, batch_size=3)
    streamer = make_streamer(broker)
    assert streamer.predict(list(range(10))) == [x * 2 for x in range(10)]
    assert len(model.batches) >= 4 and max(map(len, model.batches)) <= 3, model.batches


def test_answered_calls_complete_without_their_futures_condition(broker, make_streamer, start_worker):
    """A future makes its condition only for something that needs it (wait(),
    a done-callback); an answer that finds none is set under one lock. The
    web side once added a done-callback to every call, which cost each
    Redis call the slow path: it must not (a call it gives up is withdrawn
    all the same, see test_trimming)."""
    start_worker(broker, models.double, batch_size=8)
    streamer = make_streamer(broker)
    futures = [streamer.submit([i]) for i in range(20)]
    assert [future.result(10) for future in futures] == [[2 * i] for i in range(20)]
    assert not [future for future in futures if "_condition" in vars(future)]


def test_only_the_failing_inputs_caller_gets_the_exception(broker, make_streamer, start_worker):
    streamer = make_streamer(broker)
    inputs = [1, 2, -3, 4, 5, -6, 7]
    futures = [streamer.submit([x]) for x in inputs]
    broker.wait_queued(len(inputs))
    # Started after the calls are queued, the worker runs them as one batch.
    start_worker(broker, models.fail_on_negative, batch_size=16, max_latency=0.2)
    for x, future in zip(inputs, futures):
        if x < 0:
            with pytest.raises(ValueError, match=f"negative input {x}") as info:
                future.result(10)
            assert isinstance(info.value.__cause__, RemoteTraceback)
            assert "fail_on_negative" in info.value.__cause__.tb, "the worker's traceback should come along"
        else:
            assert future.result(10) == [x * 2]
    # A call with one bad input among good ones fails as a whole, saying
    # which input failed it; the worker keeps serving.
    future = streamer.submit([5, -1, 6])
    with pytest.raises(ValueError, match="negative input -1"):
        future.result(10)
    assert future.failed_input == 1
    assert streamer.predict([10, 11]) == [20, 22]


def test_a_lone_request_does_not_wait_for_max_latency(broker, make_streamer, start_worker):
    model = Recorder()
    start_worker(broker, model, batch_size=8, max_latency=2.0)
    streamer = make_streamer(broker)
    assert streamer.predict([0]) == [0]  # warm up the connections
    started = time.monotonic()
    assert streamer.predict([1]) == [2]
    assert time.monotonic() - started < 1.0, "a lone request waited for companions that were not coming"


def test_queued_requests_fill_batches_up_to_batch_size(broker, make_streamer, start_worker):
    model = Recorder()
    streamer = make_streamer(broker)
    futures = [streamer.submit([x]) for x in range(10)]
    broker.wait_queued(10)
    start_worker(broker, model, batch_size=4, max_latency=0.05)
    assert [f.result(10) for f in futures] == [[x * 2] for x in range(10)]
    assert [len(b) for b in model.batches] == [4, 4, 2]


def test_the_longest_timeout_a_streamer_takes_crosses_to_the_worker(broker, make_streamer, start_worker):
    # A request carries its timeout; one the worker read as out of range
    # was dropped as malformed, and its caller waited out that timeout.
    start_worker(broker, Recorder(), batch_size=4)
    streamer = make_streamer(broker, timeout=MAX_SECONDS)
    assert streamer.predict([1, 2]) == [2, 4]
    with pytest.raises(ValueError, match="at most 86400"):
        make_streamer(broker, timeout=MAX_SECONDS + 1)


def test_an_exception_type_unknown_on_the_web_side_arrives_as_remote_error(broker, make_streamer, start_worker):
    start_worker(broker, models.raise_odd, batch_size=4)
    streamer = make_streamer(broker)
    with pytest.raises(RemoteError, match="OddError: the model is odd today") as info:
        streamer.predict([1])
    assert info.value.exc_type == "OddError"
    assert "raise_odd" in info.value.__cause__.tb


def test_errors_are_not_isolated_when_isolation_is_off(broker, make_streamer, start_worker):
    streamer = make_streamer(broker)
    futures = [streamer.submit([x]) for x in (1, -2, 3)]
    broker.wait_queued(3)
    start_worker(broker, models.fail_on_negative, batch_size=8, max_latency=0.2, isolate_errors=False)
    for future in futures:
        with pytest.raises(ValueError, match="negative input -2"):
            future.result(10)


def test_a_wrong_number_of_results_fails_every_caller_of_the_batch(broker, make_streamer, start_worker):
    streamer = make_streamer(broker)
    futures = [streamer.submit([x]) for x in range(3)]
    broker.wait_queued(3)
    start_worker(broker, models.one_short, batch_size=8, max_latency=0.2)
    for future in futures:
        with pytest.raises(BatchLengthError, match="2 results for a batch of 3 inputs"):
            future.result(10)


def test_a_per_call_timeout_raises_a_timeout_error_subclass(broker, make_streamer):
    streamer = make_streamer(broker)  # no worker: nothing will answer
    started = time.monotonic()
    with pytest.raises(StreamerTimeoutError) as info:
        streamer.predict([1], timeout=0.3)
    assert isinstance(info.value, TimeoutError)
    assert 0.25 < time.monotonic() - started < 3.0


def test_a_submitted_call_completes_by_the_streamers_timeout(broker, make_streamer):
    streamer = make_streamer(broker, timeout=0.3)
    future = streamer.submit([1])
    started = time.monotonic()
    with pytest.raises(StreamerTimeoutError):
        future.result()  # no timeout of its own: still bounded by the streamer's
    assert time.monotonic() - started < 3.0


def test_apredict_awaits_the_answer(broker, make_streamer, start_worker):
    start_worker(broker, models.double, batch_size=4)
    streamer = make_streamer(broker)

    async def main() -> list:
        return await asyncio.gather(*(streamer.apredict([x]) for x in range(5)))

    assert asyncio.run(main()) == [[x * 2] for x in range(5)]


def test_close_finishes_calls_in_flight_and_removes_the_result_stream(broker, start_worker):
    start_worker(broker, models.double, batch_size=4)
    streamer = RedisStreamer(broker.url, broker.prefix, timeout=10)
    try:
        assert streamer.predict([1]) == [2]
        assert broker.result_keys(), "the web process should read its answers from a stream"
        futures = [streamer.submit([x]) for x in range(10)]
    finally:
        streamer.close(timeout=30)  # 10 s was not enough on a machine loaded 5 times over
    assert [f.result(0) for f in futures] == [[x * 2] for x in range(10)]
    assert broker.result_keys() == [], "close() should delete this web process's result stream"


def test_close_waits_for_answers_read_but_not_yet_handed_to_their_calls(broker, start_worker, monkeypatch):
    """An answer the web process has read from Redis is its call's even while
    it is on its way there: close() waits for it rather than failing the
    call with StreamerClosedError. The way is made slow here (a loaded
    machine's GIL, say) by holding each batch of answers for 0.5 s."""
    from streamer_core.backends.redis import collector

    hold_answers(monkeypatch, collector, 0.5)
    start_worker(broker, models.double, batch_size=4)
    close_answers_every_call(RedisStreamer(broker.url, broker.prefix, timeout=20))


def test_calls_after_close_fail_clearly_and_close_twice_is_fine(broker, start_worker):
    start_worker(broker, models.double, batch_size=4)
    streamer = RedisStreamer(broker.url, broker.prefix)
    assert streamer.predict([3]) == [6]
    streamer.close()
    streamer.close()
    streamer.destroy_workers()
    assert streamer.closed
    with pytest.raises(StreamerClosedError):
        streamer.predict([1])
    with pytest.raises(StreamerClosedError):
        streamer.submit([1])


def test_close_fails_what_no_worker_answered_in_time(broker):
    streamer = RedisStreamer(broker.url, broker.prefix, timeout=30)
    future = streamer.submit([1])
    broker.wait_queued(1)
    started = time.monotonic()
    streamer.close(timeout=0.3)
    assert time.monotonic() - started < 3.0
    with pytest.raises(StreamerClosedError):
        future.result(0)


def test_close_does_not_wait_past_the_deadline_of_an_unanswered_call(broker):
    """close() with a submitted call nobody answers: the call fails with
    StreamerTimeoutError at its own deadline, and close() does not wait its
    whole timeout. (Once, it waited, then failed the call as closed.)"""
    streamer = RedisStreamer(broker.url, broker.prefix, timeout=0.3)
    future = streamer.submit([1])  # no worker: nobody answers, and nobody waits on the future
    broker.wait_queued(1)
    started = time.monotonic()
    streamer.close(timeout=3)
    took = time.monotonic() - started
    with pytest.raises(StreamerTimeoutError):
        future.result(0)
    assert took < 2.0, f"close() took {took:.1f}s for a call whose timeout was 0.3 s"


def test_collector_thread_stops_on_close(broker):
    before = {t for t in threading.enumerate() if t.name.startswith("streamer-redis")}
    streamer = RedisStreamer(broker.url, broker.prefix)
    streamer.close()
    assert wait_for(lambda: {t for t in threading.enumerate() if t.name.startswith("streamer-redis")} <= before, 3)


def test_a_full_queue_refuses_calls_at_once(broker, make_streamer, start_worker):
    streamer = make_streamer(broker, max_queue=3)  # no worker yet: nothing is answered
    accepted = [streamer.submit([1]), streamer.submit([2, 3])]
    broker.wait_queued(3)
    started = time.monotonic()
    with pytest.raises(QueueFullError, match="max_queue is 3") as info:
        streamer.submit([4])
    assert time.monotonic() - started < 0.5
    assert isinstance(info.value, UnavailableError)
    assert broker.xlen() == 3, "a refused call must not be queued in Redis"
    start_worker(broker, models.double, batch_size=4)
    assert [f.result(10) for f in accepted] == [[2], [4, 6]]
    assert streamer.predict([4]) == [8], "answered calls must free their place"


def test_a_call_of_several_inputs_that_would_overflow_a_queue_with_room_is_refused_whole(broker, make_streamer):
    streamer = make_streamer(broker, max_queue=4)  # no worker: nothing is answered
    streamer.submit([1, 2])
    broker.wait_queued(2)
    with pytest.raises(QueueFullError, match="max_queue is 4"):
        streamer.submit([3, 4, 5])
    assert broker.xlen() == 2, "no input of a refused call may be queued in Redis"
    streamer.submit([6, 7])
    broker.wait_queued(4)


def test_given_up_calls_free_their_place_in_the_queue(broker, make_streamer):
    streamer = make_streamer(broker, max_queue=2)
    for _ in range(2):
        streamer.submit([0], timeout=0.1)
    with pytest.raises(QueueFullError):
        streamer.submit([0])
    assert wait_for(lambda: _fits(streamer), 3), "calls that timed out still count against max_queue"


def _fits(streamer: RedisStreamer) -> bool:
    try:
        future = streamer.submit([1], timeout=0.1)
    except QueueFullError:
        return False
    future.cancel()  # given up at once: nothing left for close() to wait on
    return True


def test_stop_lets_the_batch_in_hand_finish(broker, make_streamer, start_worker):
    entered, release = threading.Event(), threading.Event()

    def model(batch: list) -> list:
        entered.set()
        assert release.wait(10)
        return [x * 2 for x in batch]

    worker = start_worker(broker, model, batch_size=4)
    streamer = make_streamer(broker)
    future = streamer.submit([21])
    assert entered.wait(5)
    worker.worker.stop()
    time.sleep(0.1)
    assert worker.alive(), "stop() must not abandon the batch in hand"
    release.set()
    assert future.result(5) == [42]
    worker.thread.join(5)
    assert not worker.alive() and worker.error is None


def test_a_model_that_cannot_load_raises_worker_start_error(broker):
    worker = RedisWorker(models.BrokenInitModel, 4, redis_broker=broker.url, prefix=broker.prefix)
    with pytest.raises(WorkerStartError, match="weights.bin not found"):
        worker.run_forever()


@pytest.mark.parametrize("device", [0, 1])
def test_a_model_that_runs_out_of_memory_loading_says_what_to_look_at(broker, monkeypatch, device):
    from tests.core.models import FakeOutOfMemory, NoRoomToLoad

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "7")  # restored after the test; run_forever sets its own
    worker = RedisWorker(NoRoomToLoad, 4, redis_broker=broker.url, prefix=broker.prefix, oom_errors=(FakeOutOfMemory,))
    with pytest.raises(WorkerStartError, match=f"ran out of memory on device {device} while it loaded.*nvidia-smi"):
        worker.run_forever(gpu_id=device)


def test_model_init_args_reach_init_model_and_gpu_id_sets_the_device(broker, make_streamer, start_worker, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "7")  # restored after the test; the worker sets its own
    worker = RedisWorker(
        models.EnvModel,
        4,
        redis_broker=broker.url,
        prefix=broker.prefix,
        model_init_args=["emb"],
        model_init_kwargs={"delay": 0.0},
    )
    from tests.redis.conftest import ThreadWorker

    handle = ThreadWorker(worker, gpu_id=1)
    handle.thread.start()
    try:
        [answer] = make_streamer(broker).predict([0])
        assert answer["tag"] == "emb" and answer["gpu_id"] == 1 and answer["cvd"] == "1"
    finally:
        handle.stop()


@pytest.mark.parametrize(
    "kwargs, error",
    [
        (dict(model_class=object), TypeError),
        (dict(model_class=models.double, batch_size=0), ValueError),
        (dict(model_class=models.double, claim_after=0), ValueError),
        (dict(model_class=models.double, max_item_crashes=0), ValueError),
        (dict(model_class=models.double, codec="json"), ValueError),
        (dict(model_class=models.double, redis_broker="no-port-here"), ValueError),
    ],
)
def test_a_worker_with_a_bad_option_is_refused_when_made(kwargs, error):
    options = {"batch_size": 4, **kwargs}
    with pytest.raises(error):
        RedisWorker(**options)


def test_a_streamer_with_a_bad_address_or_codec_is_refused_when_made():
    with pytest.raises(ValueError, match="host:port"):
        RedisStreamer("localhost")
    with pytest.raises(ValueError, match="codec"):
        RedisStreamer("127.0.0.1:6379", codec="json")


def test_host_port_and_url_forms_both_work(broker, start_worker):
    start_worker(broker, models.double, batch_size=4)
    host_port = broker.url.split("//", 1)[1].rsplit("/", 1)[0]
    for address in (host_port, broker.url):
        with RedisStreamer(address, broker.prefix, timeout=10) as streamer:
            assert streamer.predict([5]) == [10]


def test_service_streamer_positional_signatures_still_work(broker, running):
    """Programs written for service_streamer 0.1.2 pass these positionally."""
    import inspect

    from streamer_core import run_redis_workers_forever
    from tests.redis.conftest import ThreadWorker

    assert list(inspect.signature(run_redis_workers_forever).parameters)[:9] == [
        "model_class",
        "batch_size",
        "max_latency",
        "worker_num",
        "cuda_devices",
        "redis_broker",
        "prefix",
        "model_init_args",
        "model_init_kwargs",
    ]
    worker = ThreadWorker(RedisWorker(models.EnvModel, 4, 0.01, broker.url, broker.prefix, ["emb"], {"delay": 0.0}))
    worker.thread.start()
    running.workers.append(worker)
    streamer = RedisStreamer(broker.url, broker.prefix)
    running.streamers.append(streamer)
    [answer] = streamer.predict([0])
    assert answer["tag"] == "emb"


class PostProcessingWorker(RedisWorker):
    """A service_streamer habit: a worker subclass that works on each batch
    around the model by overriding ``model_predict``."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.batches: list = []

    def model_predict(self, batch_input):
        outputs = super().model_predict(batch_input)
        self.batches.append(list(batch_input))
        return [{"doubled": out} for out in outputs]


def test_a_worker_subclass_overriding_model_predict_runs_every_batch_through_it(broker, running):
    from tests.redis.conftest import ThreadWorker

    subclass = PostProcessingWorker(models.double, 4, 0.01, broker.url, broker.prefix, claim_after=0.5)
    with pytest.raises(RuntimeError, match="run_forever"):
        subclass.model_predict([1])  # the model is loaded by run_forever
    worker = ThreadWorker(subclass)
    worker.thread.start()
    running.workers.append(worker)
    streamer = RedisStreamer(broker.url, broker.prefix, timeout=10)
    running.streamers.append(streamer)
    assert streamer.predict(list(range(10))) == [{"doubled": 2 * i} for i in range(10)]
    assert sorted(x for batch in subclass.batches for x in batch) == list(range(10))
    assert max(map(len, subclass.batches)) <= 4


def test_a_url_with_password_and_database_is_honoured(new_server):
    import redis

    from streamer_core.backends.redis import wait_for_broker
    from tests.redis.conftest import ThreadWorker

    server = new_server(extra_args=["--requirepass", "s3cret"])
    server.start()
    url = f"redis://:s3cret@127.0.0.1:{server.port}/3"
    worker = ThreadWorker(RedisWorker(models.double, 4, redis_broker=url, prefix="auth", claim_after=0.5))
    worker.thread.start()
    streamer = RedisStreamer(url, "auth", timeout=10)
    admin = redis.Redis(port=server.port, password="s3cret", db=3)
    try:
        assert streamer.predict([4]) == [8]
        assert admin.exists("streamer:auth:requests"), "the keys should be in database 3"
        missing_db = f"redis://:s3cret@127.0.0.1:{server.port}/99"
        wrong_password = f"redis://:wrong-pw@127.0.0.1:{server.port}/3"
        for url, fix in ((missing_db, "check the database number"), (wrong_password, "check the password")):
            # A setting to fix: refused where a streamer, a worker or the supervisor starts.
            with pytest.raises(ConfigurationError, match=rf"Redis refused this client.*{fix}") as refused:
                RedisStreamer(url, "auth")
            assert "s3cret" not in str(refused.value) and "wrong-pw" not in str(refused.value), "no password shown"
            refused_worker = ThreadWorker(RedisWorker(models.double, 4, redis_broker=url, prefix="auth"))
            refused_worker.thread.start()
            refused_worker.thread.join(10)
            assert isinstance(refused_worker.error, ValueError), "a worker must stop, not retry a setting for good"
            assert fix in str(refused_worker.error)
            with pytest.raises(ConfigurationError, match=fix):  # the supervisor's wait, before workers
                wait_for_broker(url, threading.Event())
        # Once serving, a password Redis no longer takes (changed under it)
        # is a fault, which calls fail with as with Redis away.
        admin.config_set("requirepass", "changed")
        admin.client_kill_filter(_type="normal", skipme=True)
        try:
            with pytest.raises(BrokerUnavailableError, match="refused the credentials.*check the password"):
                streamer.predict([1])
        finally:
            admin.config_set("requirepass", "s3cret")
    finally:
        worker.worker.stop()
        streamer.close(timeout=2)
        worker.thread.join(10)
        admin.close()


def test_workers_waiting_for_redis_stop_when_it_answers_refusing_their_password(new_server, caplog):
    """The supervisor waits for a Redis that does not answer yet, saying so;
    once it answers, refusing the password, that is a setting to fix: the
    wait ends with it rather than retrying for good."""
    from streamer_core.backends.redis import wait_for_broker

    server = new_server(extra_args=["--requirepass", "s3cret"])
    outcome: list = []

    def wait() -> None:
        try:
            outcome.append(wait_for_broker(f"redis://:hunter2@127.0.0.1:{server.port}/0", threading.Event()))
        except Exception as exc:
            outcome.append(exc)

    with caplog.at_level(logging.ERROR, logger="streamer_core.redis"):
        waiter = threading.Thread(target=wait, daemon=True)
        waiter.start()
        assert wait_for(lambda: caplog.records, 5), "the wait says that Redis does not answer"
        server.start()
        waiter.join(10)
    [line] = [r.getMessage() for r in caplog.records]
    assert line.startswith("Redis does not answer") and "hunter2" not in line, line
    [refused] = outcome
    assert isinstance(refused, ConfigurationError), refused
    assert "check the password" in str(refused), refused
    assert "hunter2" not in str(refused)


def test_prefixes_keep_models_apart(broker, redis_url, make_streamer, start_worker):
    from tests.redis.conftest import Broker

    other = Broker(redis_url)
    try:
        start_worker(broker, models.double, batch_size=4)
        start_worker(other, models.identity, batch_size=4)
        first, second = make_streamer(broker), make_streamer(other)
        with ThreadPoolExecutor(8) as pool:
            doubled = list(pool.map(lambda x: first.predict([x]), range(20)))
            same = list(pool.map(lambda x: second.predict([x]), range(20)))
        assert doubled == [[x * 2] for x in range(20)] and same == [[x] for x in range(20)]
    finally:
        other.cleanup()


def test_a_redis_streamer_made_before_a_fork_serves_in_the_forked_process(broker, start_worker):
    """Under gunicorn --preload a module-level RedisStreamer is forked: the
    forked process reads its answers from a results stream of its own (the
    parent's is the parent's to read), with threads of its own."""
    from tests.core.test_fork import run

    start_worker(broker, models.double, batch_size=8)
    report, stderr = run("redis", "call", broker.url, broker.prefix)
    child = report["child"]
    assert child.get("answer") == [42], child
    assert child["seconds"] < 5, "the forked process waited on threads that are not there"
    assert report["before"] == [2] and report["after"] == [6]
    assert "forked from it" in stderr
