"""Running Redis workers: a supervisor of spawned worker processes that
restarts the ones that die and drains them all on SIGTERM or Ctrl-C."""

from __future__ import annotations

import atexit
import logging
import multiprocessing
import multiprocessing.connection
import os
import shutil
import signal
import tempfile
import threading
import time
from typing import Any, Dict, List, NamedTuple, Optional, Sequence, Tuple

from ...config import MAX_SECONDS, OPTIONS, DeviceId, default, shown_device
from ...errors import WorkerStartError
from ...logs import LOG_FORMAT
from ...redis_address import DEFAULT_REDIS, AddressLike, RedisAddress
from ...streamer import callable_name
from ..spawning import spawn_context
from .connection import MAX_BACKOFF_S, wait_for_broker
from .presence import EXIT_HUNG, EXIT_HUNG_AFTER_ANSWERS
from .worker import RedisWorker

__all__ = ["run_redis_workers_forever", "run_worker_groups", "WorkerGroup", "EXIT_INIT_FAILED"]

logger = logging.getLogger("streamer_core.redis")

# Exit code of a worker process whose model could not load: not restarted.
EXIT_INIT_FAILED = 3
# Seconds a stopping worker has to finish its batches in hand before it is killed.
_STOP_LIMIT_S = 60.0


def _worker_process(options: Dict[str, Any], gpu_id: Optional[DeviceId], parent_pid: int) -> None:
    from ..process_worker import _watch_parent

    threading.Thread(target=_watch_parent, args=(parent_pid,), name="streamer-parent-watch", daemon=True).start()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the supervisor handles Ctrl-C
    logging.basicConfig(level=options.pop("log_level", logging.INFO), format=LOG_FORMAT)
    worker = RedisWorker(**options)
    worker._exit_when_hung = True
    try:
        worker.run_forever(gpu_id)
    except WorkerStartError:
        logger.exception("the model could not be loaded; this worker is not restarted")
        os._exit(EXIT_INIT_FAILED)


class WorkerGroup(NamedTuple):
    """The Redis workers of one model, as a supervisor runs them: ``options``
    are :class:`RedisWorker`'s keyword arguments; worker ``i`` gets device
    ``devices[i % len(devices)]``. ``name`` is used in log lines."""

    name: str
    options: Dict[str, Any]
    worker_num: int = 1
    devices: Optional[Tuple[DeviceId, ...]] = None


def run_redis_workers_forever(
    model_class: Any,
    batch_size: int,
    max_latency: float = default("max_latency"),
    worker_num: int = default("worker_num"),
    cuda_devices: Optional[Sequence[DeviceId]] = default("cuda_devices"),
    redis_broker: AddressLike = DEFAULT_REDIS,
    prefix: str = "",
    model_init_args: Optional[Sequence[Any]] = None,
    model_init_kwargs: Optional[Dict[str, Any]] = None,
    *,
    metrics_port: Optional[int] = None,
    **options: Any,
) -> int:
    """Run ``worker_num`` :class:`RedisWorker` processes, worker ``i`` on
    device ``cuda_devices[i % len(cuda_devices)]``, and keep them running:
    one that dies is started again (one whose model cannot load is not).
    SIGTERM or Ctrl-C lets every worker finish its batch in hand, then
    returns 0. ``metrics_port``: serve the workers' Prometheus metrics
    there (see :func:`run_worker_groups`). Extra keyword options go to
    :class:`RedisWorker`.

    Same signature as service_streamer's ``run_redis_workers_forever``.
    """
    worker_options = dict(
        model_class=model_class,
        batch_size=batch_size,
        max_latency=max_latency,
        redis_broker=RedisAddress.of(redis_broker),
        prefix=prefix,
        model_init_args=model_init_args,
        model_init_kwargs=model_init_kwargs,
        **options,
    )
    devices = OPTIONS["cuda_devices"].checked(cuda_devices)
    group = WorkerGroup(callable_name(model_class), worker_options, worker_num, devices)
    return run_worker_groups([group], metrics_port=metrics_port)


class _MetricsServer:
    """The workers' Prometheus metrics on ``port`` (every interface, as
    ``prometheus_client`` serves them), added up over the worker processes
    through its multiprocess mode: in a directory of its own unless
    ``PROMETHEUS_MULTIPROC_DIR`` is set already."""

    def __init__(self, port: int) -> None:
        from ...metrics import available, multiprocess_mode

        if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
            raise ValueError(f"metrics_port must be a TCP port number (0 to 65535), got {port!r}")
        if not available():
            raise ValueError("metrics_port needs prometheus_client: pip install 'streamer-core[metrics]'")
        from prometheus_client import CollectorRegistry, multiprocess, start_http_server

        self._own_dir: Optional[str] = None
        if not multiprocess_mode():
            self._own_dir = tempfile.mkdtemp(prefix="streamer-metrics-")
            os.environ["PROMETHEUS_MULTIPROC_DIR"] = self._own_dir  # the workers inherit it
        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry)  # type: ignore[no-untyped-call]
        try:
            self._server, _ = start_http_server(port, registry=registry)
        except OSError as exc:
            self.close()
            raise ValueError(f"cannot serve metrics on port {port}: {exc}") from exc
        self.port = self._server.server_port
        logger.info("serving the workers' metrics at http://0.0.0.0:%d/metrics", self.port)

    @staticmethod
    def process_ended(pid: Optional[int]) -> None:
        """Drop a dead worker's gauges (its counters and histograms stay)."""
        from prometheus_client import multiprocess

        if pid is not None:
            multiprocess.mark_process_dead(pid)  # type: ignore[no-untyped-call]

    def close(self) -> None:
        server = getattr(self, "_server", None)
        if server is not None:
            server.shutdown()
            server.server_close()
        if self._own_dir is not None:
            os.environ.pop("PROMETHEUS_MULTIPROC_DIR", None)
            shutil.rmtree(self._own_dir, ignore_errors=True)


def run_worker_groups(groups: Sequence[WorkerGroup], metrics_port: Optional[int] = None) -> int:
    """Run the workers of every group in spawned processes and keep them
    running until SIGTERM or Ctrl-C (in the main thread), then let each finish
    its batch in hand and return 0. A worker that dies is restarted, with a
    growing pause; one whose model cannot load is not. Returns 1 if every
    worker has failed to load its model. Waits for Redis first, logging
    while it does not answer.

    ``metrics_port``: serve the workers' Prometheus metrics (batch sizes,
    queue waits, model seconds, see :mod:`streamer_core.metrics`) on this
    port, added up over the workers by ``prometheus_client``'s multiprocess
    mode; 0 picks a free port.

    Everything is validated before any process starts: a bad option raises
    ``TypeError`` or ``ValueError`` here.
    """
    metrics = _MetricsServer(metrics_port) if metrics_port is not None else None
    try:
        return _supervise(groups, metrics)
    finally:
        if metrics is not None:
            metrics.close()


def _supervise(groups: Sequence[WorkerGroup], metrics: Optional[_MetricsServer]) -> int:
    slots: List[Tuple[WorkerGroup, int, Optional[DeviceId]]] = []
    for group in groups:
        OPTIONS["worker_num"].checked(group.worker_num, f"worker_num of {group.name}")
        devices = OPTIONS["cuda_devices"].checked(group.devices, f"cuda_devices of {group.name}")
        RedisWorker(**group.options)  # validate everything here, before any process starts
        for i in range(group.worker_num):
            slots.append((group, i, devices[i % len(devices)] if devices else None))
    if not slots:
        raise ValueError("no workers to run: give at least one model")
    log_level = logging.getLogger("streamer_core").getEffectiveLevel()  # the workers log as this process does
    context = spawn_context()
    processes: List[Any] = [None] * len(slots)  # multiprocessing.Process, or None once not restarted
    restarts = [0] * len(slots)
    # A worker that exited because its model hung is started again with twice
    # the hang_timeout (of the one it had, if it had answered nothing, else of
    # its group's): a batch that is only slow ends up finishing.
    hang_limits: List[Optional[float]] = [None] * len(slots)
    stopping = threading.Event()
    finished = threading.Event()

    def start(n: int) -> None:
        group, i, gpu_id = slots[n]
        options = dict(group.options, log_level=log_level)
        if hang_limits[n] is not None:
            options["hang_timeout"] = hang_limits[n]
        process = context.Process(
            target=_worker_process, args=(options, gpu_id, os.getpid()), name=f"streamer-redis-{group.name}-{i}"
        )
        process.start()
        processes[n] = process
        logger.info("%s worker %d (pid %d) started on device %s", group.name, i, process.pid, shown_device(gpu_id))

    def on_signal(signum: int, _frame: Any) -> None:
        logger.info("received %s: letting workers finish their batches", signal.Signals(signum).name)
        stopping.set()

    def at_exit() -> None:
        # The program is ending with the supervisor still running, on a thread
        # of its own: stop as on SIGTERM and wait for the workers (else
        # multiprocessing's own exit handler would join them forever).
        if not finished.is_set():
            logger.info("the program is ending: letting workers finish their batches")
            stopping.set()
            finished.wait(_STOP_LIMIT_S + 10)

    in_main = threading.current_thread() is threading.main_thread()
    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGTERM, signal.SIGINT)} if in_main else {}
    atexit.register(at_exit)
    try:
        for address in dict.fromkeys(
            RedisAddress.of(group.options.get("redis_broker", DEFAULT_REDIS)) for group in groups
        ):
            if not wait_for_broker(address, stopping):
                return 0
        for n in range(len(slots)):
            start(n)
        while not stopping.is_set():
            alive = {p.sentinel: n for n, p in enumerate(processes) if p is not None}
            if not alive:
                logger.error("every worker failed to load its model; giving up")
                return 1
            for sentinel in multiprocessing.connection.wait(list(alive), timeout=0.5):
                n = alive[sentinel]
                process = processes[n]
                process.join()
                if metrics is not None:
                    metrics.process_ended(process.pid)
                if stopping.is_set():
                    break
                group, i, _ = slots[n]
                if process.exitcode == EXIT_INIT_FAILED:
                    logger.error("%s worker %d could not load the model; not restarting it", group.name, i)
                    processes[n] = None
                    continue
                restarts[n] += 1
                hung = process.exitcode in (EXIT_HUNG, EXIT_HUNG_AFTER_ANSWERS)
                base = group.options.get("hang_timeout", default("hang_timeout"))
                if hung and base is not None:
                    had = hang_limits[n] if process.exitcode == EXIT_HUNG else None
                    hang_limits[n] = min(2 * (base if had is None else had), MAX_SECONDS)
                else:
                    hang_limits[n] = None
                why = "its model hung" if hung else f"it exited with {process.exitcode}"
                logger.warning("%s worker %d (pid %d): %s; restarting it", group.name, i, process.pid, why)
                time.sleep(min(MAX_BACKOFF_S, 0.1 * restarts[n]))
                start(n)
        for process in processes:
            if process is not None and process.is_alive():
                process.terminate()  # SIGTERM: the worker finishes its batch in hand
        for process in processes:
            if process is not None:
                process.join(_STOP_LIMIT_S)
                if process.is_alive():
                    logger.warning("worker pid %d did not finish in %g s; killing it", process.pid, _STOP_LIMIT_S)
                    process.kill()
                    process.join(5)
        return 0
    finally:
        finished.set()
        atexit.unregister(at_exit)
        for sig, handler in previous.items():
            signal.signal(sig, handler)
