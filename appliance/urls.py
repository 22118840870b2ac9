"""URL routes of the appliance."""
from django.contrib import admin
from django.urls import path

from appliance import views

urlpatterns = [
    path("health", views.health, name="health"),
    path("admin/", admin.site.urls),
]
