"""The backends: where the model runs. ``thread`` (a thread of this process)
and ``process`` (spawned worker processes, one per device slot)."""
