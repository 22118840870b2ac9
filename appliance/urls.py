"""URL routes of the appliance."""
from django.contrib import admin
from django.templatetags.static import static
from django.urls import include, path
from django.views.generic import RedirectView
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerSplitView

from appliance import views
from appliance.api.batches import BatchesView
from appliance.api.channel import ChannelView
from appliance.api.channels import ChannelsView
from appliance.api.events import EventsView
from appliance.api.exports import ExportNowView
from appliance.api.kafka import KafkaRunNowView
from appliance.api.losses import LossesAcknowledgeView
from appliance.api.metrics import MetricsView
from appliance.api.runs import RunsView
from appliance.api.search import ChannelEventsView
from appliance.api.storage import ChannelRecreateView
from appliance.api.subscriptions import (
    SubscriptionResetView,
    SubscriptionsView,
    SubscriptionView,
)
from appliance.api.takes import TakeCommitView, TakeRollbackView, TakesView

# Any uncaught exception: logged with its traceback by Django, answered naming the request id
# (a problem under /api/); a path no route matches: a problem under /api/, Django's page
# elsewhere.
handler500 = "appliance.request_id.server_error"
handler404 = "appliance.request_id.not_found"
handler400 = "appliance.request_id.bad_request"
handler403 = "appliance.request_id.permission_denied"

urlpatterns = [
    path("health", views.health, name="health"),
    path("favicon.ico", RedirectView.as_view(url=static("weir/favicon.svg"), permanent=True)),
    path("admin/", admin.site.urls),
    path("metrics", MetricsView.as_view(), name="metrics"),
    path("api/v1/channels", ChannelsView.as_view(), name="channels"),
    path("api/v1/channels/<str:name>", ChannelView.as_view(), name="channel"),
    path("api/v1/channels/<str:name>/partitions/<int:partition>/events", EventsView.as_view(),
         name="events"),
    path("api/v1/channels/<str:name>/partitions/<int:partition>/batches",
         BatchesView.as_view(), name="batches"),
    path("api/v1/channels/<str:name>/events", ChannelEventsView.as_view(), name="produce"),
    path("api/v1/channels/<str:name>/takes", TakesView.as_view(), name="takes"),
    path("api/v1/channels/<str:name>/takes/<str:take_id>/commit", TakeCommitView.as_view(),
         name="take-commit"),
    path("api/v1/channels/<str:name>/takes/<str:take_id>/rollback",
         TakeRollbackView.as_view(), name="take-rollback"),
    path("api/v1/channels/<str:name>/subscriptions", SubscriptionsView.as_view(),
         name="subscriptions"),
    path("api/v1/channels/<str:name>/subscriptions/<str:sub>", SubscriptionView.as_view(),
         name="subscription"),
    path("api/v1/channels/<str:name>/subscriptions/<str:sub>/reset",
         SubscriptionResetView.as_view(), name="subscription-reset"),
    path("api/v1/channels/<str:name>/losses/acknowledge", LossesAcknowledgeView.as_view(),
         name="losses-acknowledge"),
    path("api/v1/channels/<str:name>/recreate", ChannelRecreateView.as_view(),
         name="channel-recreate"),
    path("api/v1/channels/<str:name>/exports", ExportNowView.as_view(), name="export-now"),
    path("api/v1/channels/<str:name>/kafka-runs", KafkaRunNowView.as_view(),
         name="kafka-run-now"),
    path("api/v1/runs", RunsView.as_view(), name="runs"),
    path("api/schema/", SpectacularAPIView.as_view(), name="schema"),
    # the split view serves Swagger UI's start-up script as a file: no inline script (CSP)
    path("api/docs/", SpectacularSwaggerSplitView.as_view(url_name="schema"),
         name="swagger-ui"),
    path("", include("appliance.ui.urls")),
]
