"""What the web layers share: the Flask extension and the Django app are
thin adapters over this package, so one model behaves alike behind either.

How a setting and a request move::

    settings (Flask app.config,          spec.py: ModelSpec.from_settings
    Django settings.STREAMER)   ------>    each value checked by its option
                                           (streamer_core.options.config.OPTIONS),
                                           named as the user wrote it
                                         ModelSpec.build()  --> the streamer, on first use
                                         ModelSpec.worker_group() --> Redis workers (the commands)

    request ------------------------>    cycle.py: Cycle.serve / aserve
                                           parse, predict, respond; every
                                           failure to its status (http.py)
    /healthz, /readyz --------------->    probes.py
    the status commands ------------->    status.py

Nothing here imports a web framework: each layer passes in what is its own
(how to answer, its logger, its debug flag, its request object).
"""
