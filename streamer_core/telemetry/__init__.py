"""What is observed of a running streamer.

Every streamer counts what it does in plain Python
(:mod:`~streamer_core.telemetry.stats`), read as values
(:mod:`~streamer_core.telemetry.snapshots`) by ``stats()``, the dashboard and
the status command; :mod:`~streamer_core.telemetry.metrics` exports the same
counts to Prometheus. Requests and batches become OpenTelemetry spans in
:mod:`~streamer_core.telemetry.tracing`, through the SDK or the cheaper
:mod:`~streamer_core.telemetry.span_recorder`.
"""
