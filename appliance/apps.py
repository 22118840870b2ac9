"""The appliance's Django app: connects the signal handlers of the row cache and the
task scheduler in every process (web workers, Celery workers, management commands), so
a change made in any of them is seen by all."""
from __future__ import annotations

from django.apps import AppConfig


class ApplianceConfig(AppConfig):
    """Weir's appliance."""

    name = "appliance"

    def ready(self) -> None:
        """Connect the signal handlers."""
        from appliance import row_cache, tasks  # noqa: F401  (they connect on import)
