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

from ...errors import WorkerStartError
from ...logs import LOG_FORMAT
from ...options.config import MAX_SECONDS, OPTIONS, DeviceId, default, shown_device
from ...options.redis_address import DEFAULT_REDIS, AddressLike, RedisAddress
from ...streamer import callable_name
from ...threads import background
from ..spawning import spawn_context, thread_locks_for_progress_bars
from .connection import MAX_BACKOFF_S, wait_for_broker
from .presence import EXIT_HUNG, EXIT_HUNG_AFTER_ANSWERS
from .worker import RedisWorker

__all__ = ["run_redis_workers_forever", "run_worker_groups", "WorkerGroup", "EXIT_INIT_FAILED"]

logger = logging.getLogger("streamer_core.redis")

# Exit code of a worker process whose model could not load: not restarted.
EXIT_INIT_FAILED = 3
# Seconds a stopping worker has to finish its batches in hand before it is killed.
_STOP_LIMIT_S = 60.0


def _worker_process(options: Dict[str, Any], gpu_id: Optional[DeviceId], parent_pid: int, failed: Any) -> None:
    """A worker process's body. ``failed`` (a shared flag) is set when its
    model could not load: the exit code alone cannot say so, since a model
    may exit with any code (``os._exit(3)``) once it serves."""
    from ..process_worker import watch_parent

    thread_locks_for_progress_bars()
    background(watch_parent, "streamer-parent-watch", (parent_pid,)).start()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the supervisor handles Ctrl-C
    logging.basicConfig(level=options.pop("log_level", logging.INFO), format=LOG_FORMAT)
    worker = RedisWorker(**options)
    worker._exit_when_hung = True
    try:
        worker.run_forever(gpu_id)
    except WorkerStartError:
        logger.exception("the model could not be loaded; this worker is not restarted")
        failed.value = 1
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
        from ...telemetry.metrics import available, multiprocess_mode

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
    queue waits, model seconds, see :mod:`streamer_core.telemetry.metrics`) on this
    port, added up over the workers by ``prometheus_client``'s multiprocess
    mode; 0 picks a free port.

    Everything is validated before any process starts: a bad option raises
    ``TypeError`` or ``ValueError`` here.
    """
    supervisor = _Supervisor(groups)  # everything checked before the metrics port is taken
    metrics = _MetricsServer(metrics_port) if metrics_port is not None else None
    try:
        return supervisor.run(metrics)
    finally:
        if metrics is not None:
            metrics.close()


class _Supervisor:
    """The worker processes of some groups, kept running by :meth:`run`:
    one per slot (a group's worker ``i`` on its device), started again
    when it dies (its model hung: with twice the ``hang_timeout``), never
    when its model cannot load."""

    def __init__(self, groups: Sequence[WorkerGroup]) -> None:
        self._groups = groups
        self._slots: List[Tuple[WorkerGroup, int, Optional[DeviceId]]] = []
        for group in groups:
            OPTIONS["worker_num"].checked(group.worker_num, f"worker_num of {group.name}")
            devices = OPTIONS["cuda_devices"].checked(group.devices, f"cuda_devices of {group.name}")
            RedisWorker(**group.options)  # validate everything here, before any process starts
            for i in range(group.worker_num):
                self._slots.append((group, i, devices[i % len(devices)] if devices else None))
        if not self._slots:
            raise ValueError("no workers to run: give at least one model")
        self._log_level = logging.getLogger("streamer_core").getEffectiveLevel()  # the workers log as this does
        self._context = spawn_context()
        self._processes: List[Any] = [None] * len(self._slots)  # multiprocessing.Process; None: not restarted
        # Set by a worker whose model could not load (see _worker_process).
        self._load_failed = [self._context.Value("b", 0, lock=False) for _ in self._slots]
        self._restarts = [0] * len(self._slots)
        # A worker that exited because its model hung is started again with
        # twice the hang_timeout (of the one it had, if it had answered
        # nothing, else of its group's): a batch that is only slow ends up finishing.
        self._hang_limits: List[Optional[float]] = [None] * len(self._slots)
        self._stopping = threading.Event()
        self._finished = threading.Event()

    def run(self, metrics: Optional[_MetricsServer]) -> int:
        """Wait for Redis, start every worker and keep them running until
        SIGTERM or Ctrl-C (in the main thread) or the program's end, then
        let each finish its batch in hand: 0; 1 if every model failed to load."""
        in_main = threading.current_thread() is threading.main_thread()
        previous = (
            {sig: signal.signal(sig, self._on_signal) for sig in (signal.SIGTERM, signal.SIGINT)} if in_main else {}
        )
        atexit.register(self._at_exit)
        try:
            addresses = (RedisAddress.of(group.options.get("redis_broker", DEFAULT_REDIS)) for group in self._groups)
            for address in dict.fromkeys(addresses):
                if not wait_for_broker(address, self._stopping):
                    return 0
            for n in range(len(self._slots)):
                self._start(n)
            if not self._watch(metrics):
                logger.error("every worker failed to load its model; giving up")
                return 1
            self._stop_all()
            return 0
        finally:
            self._finished.set()
            atexit.unregister(self._at_exit)
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    def _watch(self, metrics: Optional[_MetricsServer]) -> bool:
        """Restart each worker that dies, until stopping (True) or until no
        worker is left to restart (False)."""
        processes = self._processes
        while not self._stopping.is_set():
            alive = {p.sentinel: n for n, p in enumerate(processes) if p is not None}
            if not alive:
                return False
            for sentinel in multiprocessing.connection.wait(list(alive), timeout=0.5):
                n = alive[sentinel]
                process = processes[n]
                process.join()
                if metrics is not None:
                    metrics.process_ended(process.pid)
                if self._stopping.is_set():
                    break
                self._ended(n, process)
        return True

    def _ended(self, n: int, process: Any) -> None:
        """Worker ``n`` exited: start it again, unless its model could not load."""
        group, i, _ = self._slots[n]
        if process.exitcode == EXIT_INIT_FAILED and self._load_failed[n].value:
            logger.error("%s worker %d could not load the model; not restarting it", group.name, i)
            self._processes[n] = None
            return
        self._restarts[n] += 1
        hung = process.exitcode in (EXIT_HUNG, EXIT_HUNG_AFTER_ANSWERS)
        base = group.options.get("hang_timeout", default("hang_timeout"))
        if hung and base is not None:
            had = self._hang_limits[n] if process.exitcode == EXIT_HUNG else None
            self._hang_limits[n] = min(2 * (base if had is None else had), MAX_SECONDS)
        else:
            self._hang_limits[n] = None
        why = "its model hung" if hung else f"it exited with {process.exitcode}"
        logger.warning("%s worker %d (pid %d): %s; restarting it", group.name, i, process.pid, why)
        time.sleep(min(MAX_BACKOFF_S, 0.1 * self._restarts[n]))
        self._start(n)

    def _start(self, n: int) -> None:
        group, i, gpu_id = self._slots[n]
        options = dict(group.options, log_level=self._log_level)
        if self._hang_limits[n] is not None:
            options["hang_timeout"] = self._hang_limits[n]
        self._load_failed[n].value = 0
        process = self._context.Process(
            target=_worker_process,
            args=(options, gpu_id, os.getpid(), self._load_failed[n]),
            name=f"streamer-redis-{group.name}-{i}",
        )
        process.start()
        self._processes[n] = process
        logger.info("%s worker %d (pid %d) started on device %s", group.name, i, process.pid, shown_device(gpu_id))

    def _stop_all(self) -> None:
        """SIGTERM each worker (it finishes its batch in hand); kill one that
        has not within _STOP_LIMIT_S."""
        processes = [process for process in self._processes if process is not None]
        for process in processes:
            if process.is_alive():
                process.terminate()
        for process in processes:
            process.join(_STOP_LIMIT_S)
            if process.is_alive():
                logger.warning("worker pid %d did not finish in %g s; killing it", process.pid, _STOP_LIMIT_S)
                process.kill()
                process.join(5)

    def _on_signal(self, signum: int, _frame: Any) -> None:
        logger.info("received %s: letting workers finish their batches", signal.Signals(signum).name)
        self._stopping.set()

    def _at_exit(self) -> None:
        # The program is ending with the supervisor still running, on a thread
        # of its own: stop as on SIGTERM and wait for the workers (else
        # multiprocessing's own exit handler would join them forever).
        if not self._finished.is_set():
            logger.info("the program is ending: letting workers finish their batches")
            self._stopping.set()
            self._finished.wait(_STOP_LIMIT_S + 10)
