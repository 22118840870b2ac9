"""Who may use the UI: logged-in staff users (the same people the API lets in by session)."""
from __future__ import annotations

from collections.abc import Callable
from functools import wraps
from typing import Any

from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_safe

View = Callable[..., HttpResponse]


def operator_required(view: View) -> View:
    """Send anonymous users to the login page; refuse logged-in users who are not staff."""
    @login_required
    @wraps(view)
    def wrapped(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        if not request.user.is_staff:
            raise PermissionDenied("the admin UI is for staff users")
        return view(request, *args, **kwargs)
    return wrapped


def page(view: View) -> View:
    """A page that only shows (GET, HEAD): any other method is answered 405 naming the
    allowed ones, before the CSRF check would answer a misleading 403 (a page that
    changes nothing needs no CSRF token); then operator_required."""
    return csrf_exempt(require_safe(operator_required(view)))
