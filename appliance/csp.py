"""Content-Security-Policy on every answer, from settings.SECURE_CSP.

SECURE_CSP is a dict of directive -> sources, the name and shape of Django 6's own
setting (django.middleware.csp), so that moving to Django 6 replaces this module with
Django's middleware and keeps the setting. The policy (appliance/settings.py) allows script
only from the appliance's own files: no inline script, no inline event handlers, no eval.
Paths under settings.WEIR_CSP_INLINE_STYLE_PATHS (DRF's browsable API and the Swagger UI,
third-party pages written with style attributes and <style> blocks) also allow inline
style, never inline script. An answer that already has the header keeps its own.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from django.conf import settings
from django.http import HttpRequest, HttpResponse

HEADER = "Content-Security-Policy"


def render(policy: Mapping[str, Sequence[str]]) -> str:
    """The header value of a policy dict."""
    return "; ".join(" ".join([name, *sources]) for name, sources in policy.items())


def policy_for(path: str) -> str:
    """The policy of an answer to `path`."""
    policy = dict(settings.SECURE_CSP)
    if path.startswith(tuple(settings.WEIR_CSP_INLINE_STYLE_PATHS)):
        policy["style-src"] = [*policy.get("style-src", ["'self'"]), "'unsafe-inline'"]
    return render(policy)


class ContentSecurityPolicyMiddleware:
    """Sets Content-Security-Policy on every answer that has none."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        """Answer, then add the policy of the request's path."""
        response = self.get_response(request)
        if HEADER not in response:
            response[HEADER] = policy_for(request.path)
        return response
