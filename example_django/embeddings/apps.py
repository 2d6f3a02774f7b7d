from django.apps import AppConfig


class EmbeddingsConfig(AppConfig):
    name = "example_django.embeddings"
    label = "embeddings"
