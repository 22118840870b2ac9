"""Content-Security-Policy (appliance/csp.py): every page of the UI (and everything else the
appliance answers) forbids inline script, eval, plugins, <base> and framing; the UI's
templates hold no inline script, event handler or style for the policy to refuse. The
browser tests (tests/e2e/test_csp.py) load every page in Chromium and see no violation."""
from __future__ import annotations

import re
from pathlib import Path

import pytest
from appliance_helpers import channel_row
from django.contrib.auth.models import User
from django.http import HttpRequest, HttpResponse
from django.test import Client, RequestFactory

from appliance.csp import ContentSecurityPolicyMiddleware, policy_for

pytestmark = pytest.mark.django_db(transaction=True)
TEMPLATES = Path(__file__).resolve().parents[2] / "templates"


def directives(header: str) -> dict[str, list[str]]:
    out = {}
    for part in header.split(";"):
        name, *sources = part.split()
        out[name] = sources
    return out


@pytest.fixture()
def operator(root: Path) -> Client:
    client = Client()
    client.force_login(User.objects.create_user("ops", password="pw", is_staff=True))
    return client


UI_PAGES = ["/", "/ui/status", "/channels/new", "/channels/orders/",
            "/channels/orders/status", "/channels/orders/events?partition=0&offset=0",
            "/channels/orders/delete"]


@pytest.mark.parametrize("path", UI_PAGES)
def test_it_sends_a_policy_forbidding_inline_script_on_every_ui_page(
        operator: Client, root: Path, path: str) -> None:
    channel_row(root)
    response = operator.get(path)
    assert response.status_code == 200, path
    policy = directives(response["Content-Security-Policy"])
    assert policy["script-src"] == ["'self'"]
    assert policy["style-src"] == ["'self'"]
    assert policy["object-src"] == ["'none'"]
    assert policy["base-uri"] == ["'none'"]
    assert policy["frame-ancestors"] == ["'none'"]
    assert policy["default-src"] == ["'self'"]


def test_it_sends_the_policy_on_the_login_page_errors_and_the_api(root: Path) -> None:
    client = Client()
    for path in ("/login/", "/no-such-page", "/api/v1/channels", "/health", "/metrics"):
        header = client.get(path)["Content-Security-Policy"]
        assert "script-src 'self';" in header and "'unsafe-eval'" not in header, path


def test_it_allows_inline_style_but_never_inline_script_under_the_api() -> None:
    policy = directives(policy_for("/api/docs/"))
    assert policy["style-src"] == ["'self'", "'unsafe-inline'"]
    assert policy["script-src"] == ["'self'"]
    assert directives(policy_for("/channels/orders/"))["style-src"] == ["'self'"]


def test_it_serves_swagger_ui_without_inline_script(operator: Client) -> None:
    page = operator.get("/api/docs/").content.decode()
    assert not re.search(r"<script(?![^>]*\bsrc=)[^>]*>", page)
    script = operator.get("/api/docs/?script=")
    assert script.status_code == 200 and b"SwaggerUIBundle" in script.content


INLINE = [
    (r"<script(?![^>]*\bsrc=)(?![^>]*type=\"application/json\")[^>]*>", "an inline script"),
    (r"\son[a-z]+\s*=", "an inline event handler"),
    (r"\sstyle\s*=", "a style attribute"),
    (r"<style", "a <style> block"),
    (r"javascript:", "a javascript: URL"),
]


@pytest.mark.parametrize("template", sorted(TEMPLATES.rglob("*.html")),
                         ids=lambda p: str(p.relative_to(TEMPLATES)))
def test_it_keeps_every_template_free_of_inline_script_and_style(template: Path) -> None:
    text = template.read_text()
    for pattern, what in INLINE:
        assert not re.search(pattern, text, re.IGNORECASE), f"{template.name} has {what}"


def test_it_keeps_a_policy_an_answer_already_has() -> None:
    def own_policy(request: HttpRequest) -> HttpResponse:
        response = HttpResponse("x")
        response["Content-Security-Policy"] = "default-src 'none'"
        return response
    middleware = ContentSecurityPolicyMiddleware(own_policy)
    assert middleware(RequestFactory().get("/"))["Content-Security-Policy"] == \
        "default-src 'none'"
