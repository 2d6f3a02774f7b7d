"""The process backend's public face: :class:`Streamer`, whose model runs
in spawned worker processes (one per GPU, or several on one). How batches,
results and deaths move between this process and the workers is
:mod:`.process_backend`'s; a worker's own loop is :mod:`.process_worker`'s.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Sequence, Tuple, cast

from ..managed_model import check_model
from ..options.config import OPTIONS, BatchingConfig, BatchingOptions, DeviceId, default
from ..streamer import BaseStreamer, callable_name
from .process_backend import ProcessBackend

if TYPE_CHECKING:
    from typing_extensions import Unpack

__all__ = ["Streamer"]


class Streamer(BaseStreamer):
    """Batch calls to a model running in ``worker_num`` spawned processes.

    ``predict_function_or_model`` is a module-level function taking a list, or
    a :class:`ManagedModel` subclass, which each worker builds for itself with
    ``model_init_args``/``model_init_kwargs`` after setting
    ``CUDA_VISIBLE_DEVICES`` to its device, ``cuda_devices[i % len(cuda_devices)]``.
    Inputs and results are pickled across the process boundary.

    Batching options as for :class:`ThreadedStreamer` (``item_cost`` runs
    in this process, so it need not pickle), plus ``max_item_crashes``
    (default 2): a worker that
    dies mid-batch is restarted and its inputs are run again one by one; an
    input that has been in this many batches whose worker died fails with
    :class:`WorkerDiedError` instead of killing more workers, ``name``
    (the model's name in :meth:`stats` and the metrics; default the
    function's or class's name), and ``shared_memory_min_bytes`` (default
    8 KiB): a numpy array or CPU tensor of at least this many bytes, in an
    input or a result, crosses through shared memory (copied once each way,
    and seen by the model in place) instead of the pipe; ``None`` sends
    everything through the pipe. The model may change an input array it is
    given, but must not keep it past its call: the memory is reused.
    ``hang_timeout`` (seconds, default 60; ``None``: never): a worker that
    has run one batch this long while none of that batch's callers waits
    any more (each timed out or gave up) is taken for hung, killed and
    restarted, so a model stuck for good (a deadlock, a GPU that stopped
    answering) does not stop the service; each kill doubles that worker's
    wait until it answers a batch.

    The constructor returns at once; calls queue until a worker is ready
    (:meth:`wait_ready` waits for that). Same signature as service_streamer's
    ``Streamer``.
    """

    def __init__(
        self,
        predict_function_or_model: Any,
        batch_size: int,
        max_latency: float = default("max_latency"),
        worker_num: int = default("worker_num"),
        cuda_devices: Optional[Sequence[DeviceId]] = default("cuda_devices"),
        model_init_args: Optional[Sequence[Any]] = None,
        model_init_kwargs: Optional[Dict[str, Any]] = None,
        *,
        max_item_crashes: int = default("max_item_crashes"),
        name: Optional[str] = None,
        shared_memory_min_bytes: Optional[int] = default("shared_memory_min_bytes"),
        hang_timeout: Optional[float] = default("hang_timeout"),
        **options: Unpack[BatchingOptions],
    ) -> None:
        config = BatchingConfig(batch_size, max_latency, **options)
        kept = (max_item_crashes, shared_memory_min_bytes, hang_timeout)
        self._start_on(
            predict_function_or_model, config, worker_num, cuda_devices, model_init_args, model_init_kwargs, name, *kept
        )

    @classmethod
    def from_config(
        cls,
        predict_function_or_model: Any,
        config: BatchingConfig,
        worker_num: int = default("worker_num"),
        cuda_devices: Optional[Sequence[DeviceId]] = default("cuda_devices"),
        model_init_args: Optional[Sequence[Any]] = None,
        model_init_kwargs: Optional[Dict[str, Any]] = None,
        *,
        name: Optional[str] = None,
    ) -> Streamer:
        """A streamer of ``config``, a :class:`BatchingConfig` made (and so
        checked) already: what the Flask and Django layers make from their settings."""
        streamer = cls.__new__(cls)
        defaults = (default("max_item_crashes"), default("shared_memory_min_bytes"), default("hang_timeout"))
        streamer._start_on(
            predict_function_or_model,
            config,
            worker_num,
            cuda_devices,
            model_init_args,
            model_init_kwargs,
            name,
            *defaults,
        )
        return streamer

    def _start_on(
        self, target: Any, config: BatchingConfig, worker_num: int, cuda_devices: Optional[Sequence[DeviceId]],
        model_init_args: Optional[Sequence[Any]], model_init_kwargs: Optional[Dict[str, Any]], name: Optional[str],
        max_item_crashes: int, shared_memory_min_bytes: Optional[int], hang_timeout: Optional[float],
    ) -> None:  # fmt: skip
        OPTIONS["worker_num"].checked(worker_num)
        OPTIONS["max_item_crashes"].checked(max_item_crashes)
        OPTIONS["shared_memory_min_bytes"].checked(shared_memory_min_bytes)
        hang_timeout = OPTIONS["hang_timeout"].checked(hang_timeout)
        devices: Optional[Tuple[DeviceId, ...]] = OPTIONS["cuda_devices"].checked(cuda_devices)
        check_model("predict_function_or_model", target)
        self.worker_num = worker_num
        self.cuda_devices = list(devices) if devices is not None else None
        name = callable_name(target) if name is None else name
        backend = functools.partial(
            ProcessBackend,
            target,
            worker_num,
            devices,
            model_init_args or (),
            model_init_kwargs or {},
            config,
            shared_memory_min_bytes,
            hang_timeout,
            name,
        )
        super().__init__(config, backend, max_item_crashes=max_item_crashes, name=name)

    @property
    def _backend(self) -> ProcessBackend:
        return cast(ProcessBackend, self._engine.backend)

    def worker_pids(self) -> List[int]:
        """Process ids of the workers alive now."""
        return self._backend.pids()

    def _wait_for_worker_ready(self, timeout: float = 20.0) -> bool:
        """service_streamer's name for :meth:`wait_ready`."""
        return self.wait_ready(timeout)
