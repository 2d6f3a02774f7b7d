"""A URLconf with a batched view of a model the settings lack (check E010)."""

from django.urls import include, path

from django_streamer import BatchedView

urlpatterns = [
    path("api/", include([path("ghost", BatchedView.as_view(model="ghost"))])),
]
