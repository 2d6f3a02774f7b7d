from django.urls import include, path

from .embeddings import views

urlpatterns = [
    path("", views.index),
    path("naive", views.naive),
    path("stream", views.stream),
    path("astream", views.astream),
    path("classify", views.classify),
    path("v1/embeddings", views.embeddings),
    path("v1/models", views.models),
    path("", include("django_streamer.urls")),  # metrics, healthz, readyz
]

# Every answer is JSON: what Django refuses before a view (400, a Host not
# allowed), a refusal (403), an unknown path's 404 and a server error's 500 too.
handler400 = "django_streamer.views.bad_request"
handler403 = "django_streamer.views.permission_denied"
handler404 = "django_streamer.views.page_not_found"
handler500 = "django_streamer.views.server_error"
