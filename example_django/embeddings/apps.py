from django.apps import AppConfig
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured


class EmbeddingsConfig(AppConfig):
    name = "example_django.embeddings"
    label = "embeddings"

    def ready(self) -> None:
        # A precision the model cannot run in would fail every request:
        # refuse to start instead, naming the setting and its choices.
        from example_models.embedding import checked_precision

        try:
            checked_precision(getattr(settings, "EMBEDDING_PRECISION", "auto"))
        except ValueError as exc:
            raise ImproperlyConfigured(str(exc)) from None
