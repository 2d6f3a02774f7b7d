from django.urls import path

from .embeddings import views

urlpatterns = [
    path("", views.index),
    path("naive", views.naive),
    path("stream", views.stream),
    path("astream", views.astream),
]
