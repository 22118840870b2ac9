"""URL routes of the appliance."""
from django.contrib import admin
from django.urls import path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView

from appliance import views
from appliance.produce import ProduceView

urlpatterns = [
    path("health", views.health, name="health"),
    path("admin/", admin.site.urls),
    path("api/v1/channels/<str:name>/events", ProduceView.as_view(), name="produce"),
    path("api/schema/", SpectacularAPIView.as_view(), name="schema"),
    path("api/docs/", SpectacularSwaggerView.as_view(url_name="schema"), name="swagger-ui"),
]
