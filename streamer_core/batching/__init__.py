"""Where batches are formed and run.

Calls come in through a backend's :class:`~streamer_core.batching.scheduler.Scheduler`
(thread and process backends; a call and its inputs are held as in
:mod:`~streamer_core.batching.calls`) or a Redis worker's reader; their inputs wait
in a :class:`~streamer_core.batching.former.BatchFormer`, in the line it is given
(:mod:`~streamer_core.batching.queues`: one in arrival order, or one per priority
level, :mod:`~streamer_core.batching.levels`), a large call's rest parked
(:mod:`~streamer_core.batching.parking`), until a batch goes: shaped by what inputs
cost (:mod:`~streamer_core.batching.shaping`), held for companions
(:mod:`~streamer_core.batching.hold`), served newest first under overload
(:mod:`~streamer_core.batching.overload`), handed to a worker with room
(:mod:`~streamer_core.batching.capacity`). A batch then runs on the model in
:mod:`~streamer_core.batching.runner`, which splits one that fails or runs out of
memory (:mod:`~streamer_core.batching.oom`). Calls end by their deadlines
(:mod:`~streamer_core.batching.deadlines`) wherever their inputs are, or sooner
where no batch could answer them in time (:mod:`~streamer_core.batching.expiry`).
"""
