from django.urls import include, path

from .embeddings import views

urlpatterns = [
    path("", views.index),
    path("naive", views.naive),
    path("stream", views.stream),
    path("astream", views.astream),
    path("classify", views.classify),
    path("", include("django_streamer.urls")),  # metrics, healthz, readyz
]
