"""WSGI entry point (gunicorn appliance.wsgi)."""
import os

from django.core.wsgi import get_wsgi_application
from django.urls import get_resolver

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "appliance.settings")
application = get_wsgi_application()
# Import every view now, not in a worker's first request: that one would take seconds
get_resolver().resolve("/health")
