"""Views of the appliance. For now: health, the only page open without login."""
from django.http import HttpRequest, JsonResponse

import channel_engine


def health(request: HttpRequest) -> JsonResponse:
    """Answer 200 with the engine version when the web process is up."""
    return JsonResponse({"status": "ok", "engine": channel_engine.__version__})
