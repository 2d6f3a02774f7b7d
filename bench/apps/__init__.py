"""The apps and models the benchmarks drive, served as a user serves them.

``http_app`` (a Flask app of the simulated or real model, for
``bench.http_bench``) under one of ``http_server``'s servers; ``web_apps``
(the examples' models behind service_streamer's plain views, for
``bench.web_bench``); ``cost_models`` (service_streamer's version of the
example's model, for ``bench.cost_bench``). The harnesses that start and
measure them are the modules of ``bench`` itself; nothing here measures.
"""
