"""example_models: the models both examples serve, and the API they serve
one of them by. example_flask and example_django each import from here, so
that neither imports the other.

    embedding    sentence embeddings (all-MiniLM-L6-v2 by sentence-transformers):
                 ``SentenceEmbedder``, the ManagedModel behind ``/stream``
    vision       an ImageNet classifier (EfficientNet-Lite0): ``ImageClassifier``,
                 the ManagedModel behind ``/classify``
    openai_api   OpenAI's embeddings API (``/v1/embeddings``, ``/v1/models``)
                 on the sentence model, framework-free

They are not part of the library (the wheel holds streamer_core,
flask_streamer and django_streamer only): the examples run from the
repository's root, where this package imports without an install.
"""
