"""What a user sets, and how each value is checked.

:mod:`~streamer_core.options.config` holds every option of the streamers,
their workers and the web layers in one table (``OPTIONS``), read by the
Flask and Django settings, the worker commands and the docs' reference.
Values are checked as they are given, by the checks of
:mod:`~streamer_core.options.checks`, with the forms of CUDA devices
(:mod:`~streamer_core.options.devices`) and of Redis addresses
(:mod:`~streamer_core.options.redis_address`) beside them.
"""
