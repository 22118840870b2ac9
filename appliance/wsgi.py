"""WSGI entry point (gunicorn appliance.wsgi): Django, behind the produce endpoint's fast
path (appliance/fast_produce.py)."""
import os

from django.core.wsgi import get_wsgi_application
from django.urls import get_resolver

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "appliance.settings")
django_application = get_wsgi_application()
# Import every view now, not in a worker's first request: that one would take seconds
get_resolver().resolve("/health")

from appliance.fast_produce import FastProduce  # noqa: E402 - needs Django set up
from appliance.frozen_heap import freeze_startup_objects  # noqa: E402

application = FastProduce(django_application)
freeze_startup_objects()  # after the app is loaded: no full collection visits it again
