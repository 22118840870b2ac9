"""The Weir appliance (Django project); its Celery app loads with it."""
from appliance.celery import app as celery_app

__all__ = ["celery_app"]
