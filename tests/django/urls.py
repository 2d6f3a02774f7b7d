from django.urls import include, path

from . import views

urlpatterns = [
    path("double", views.double),
    path("double-many", views.double_many),
    path("adouble-many", views.adouble_many),
    path("double-many-cbv", views.double_many_cbv),
    path("adouble", views.adouble),
    path("wrapped/<int:x>", views.wrapped),
    path("asizes", views.asizes),
    path("sizes-cbv", views.Sizes.as_view()),
    path("direct", views.direct),
    path("double-cbv", views.double_cbv),
    path("double-guarded", views.double_guarded),
    path("pid", views.pid),
    path("process", views.process),
    path("hold", views.hold),
    path("broken-parse", views.broken_parse),
    path("broken-respond", views.broken_respond),
    path("guarded", views.guarded),
    path("unpicklable", views.unpicklable),
    path("vectors", views.vectors),
    path("upload", views.upload),
    path("agate", views.agate),
    path("gate", views.gate),
    path("gate-dropped", views.gate_dropped),
    path("ranked-search", views.ranked_search),
    path("aranked-header", views.aranked_header),
    path("ranked-bulk", views.ranked_bulk),
    path("ranked-named-header", views.ranked_named_header),
    path("ops/", include("django_streamer.urls")),
]
