"""Routes of the admin UI (see appliance/ui/__init__.py for the map)."""
from django.contrib.auth import views as auth_views
from django.urls import path

from appliance.ui import actions, browser, pages, produce_form

app_name = "ui"
urlpatterns = [
    path("login/", auth_views.LoginView.as_view(template_name="ui/login.html",
                                                redirect_authenticated_user=True),
         name="login"),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("", pages.dashboard, name="dashboard"),
    path("ui/status", pages.dashboard_status, name="dashboard-status"),
    path("channels/new", pages.channel_new, name="channel-new"),
    path("channels/<str:name>/", pages.channel, name="channel"),
    path("channels/<str:name>/status", pages.channel_status, name="channel-status"),
    path("channels/<str:name>/settings", pages.channel_settings, name="channel-settings"),
    path("channels/<str:name>/events", browser.events, name="events"),
    path("channels/<str:name>/produce", produce_form.produce, name="produce"),
    path("channels/<str:name>/events/tail", browser.events_tail, name="events-tail"),
    path("channels/<str:name>/events/<int:partition>/<int:offset>", browser.event_body,
         name="event-body"),
    path("channels/<str:name>/checkpoint", actions.run_now, {"action": "checkpoint"},
         name="checkpoint"),
    path("channels/<str:name>/flush", actions.run_now, {"action": "flush"}, name="flush"),
    path("channels/<str:name>/retention", actions.run_now, {"action": "retention"},
         name="retention"),
    path("channels/<str:name>/export", actions.export_now, name="export"),
    path("channels/<str:name>/kafka", actions.kafka_now, name="kafka"),
    path("channels/<str:name>/pause", actions.pause, {"paused": True}, name="pause"),
    path("channels/<str:name>/resume", actions.pause, {"paused": False}, name="resume"),
    path("channels/<str:name>/verify", actions.verify, name="verify"),
    path("channels/<str:name>/losses/acknowledge", actions.acknowledge_losses,
         name="losses-acknowledge"),
    path("channels/<str:name>/recreate", actions.recreate, name="recreate"),
    path("channels/<str:name>/subscriptions", actions.subscription_add,
         name="subscription-add"),
    path("channels/<str:name>/subscriptions/<str:sub>/reset", actions.subscription_reset,
         name="subscription-reset"),
    path("channels/<str:name>/subscriptions/<str:sub>/remove", actions.subscription_remove,
         name="subscription-remove"),
    path("channels/<str:name>/tokens", actions.create_token, name="token-create"),
    path("channels/<str:name>/tokens/<int:pk>/revoke", actions.revoke_token,
         name="token-revoke"),
    path("channels/<str:name>/delete", actions.delete, name="delete"),
    path("tokens/<int:pk>/revoke", actions.revoke_all_channel_token,
         name="all-channel-token-revoke"),
]
