"""The permission matrix: every endpoint × role × channel scope (and anonymous), checked
against the rule — produce puts, consume takes, admin does everything; a scoped token only
on its channels; nobody anonymous."""
from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path

import pytest
from django.test import override_settings
from rest_framework.test import APIClient

from appliance import channels
from appliance.consume import receipt
from appliance.models import ApiToken, Channel

pytestmark = pytest.mark.django_db

# (method, path, body, the role it needs, does it name a channel)
ENDPOINTS = [
    ("post", "/api/v1/channels/{c}/events", {"events": [{"body": "x"}]}, "produce", True),
    ("post", "/api/v1/channels/{c}/takes", {"max_events": 1}, "consume", True),
    ("post", "/api/v1/channels/{c}/takes/{r}/rollback", None, "consume", True),
    ("get", "/api/v1/channels/{c}", None, "admin", True),
    ("get", "/api/v1/channels/{c}/partitions/0/events?offset=0", None, "admin", True),
    ("patch", "/api/v1/channels/{c}", {"keep_alive_ms": 10}, "admin", True),
    ("post", "/api/v1/channels/{c}/losses/acknowledge", None, "admin", True),
    ("get", "/api/v1/channels", None, "admin", False),
    ("get", "/metrics", None, "admin", False),
]
ROLES = [None, "produce", "consume", "admin"]
SCOPES = ["all", "this", "other"]


@pytest.fixture()
def rows(tmp_path: Path) -> Iterator[tuple[Channel, Channel]]:
    with override_settings(WEIR_DATA_ROOTS=[tmp_path]):
        made = []
        for name in ("orders", "audit"):
            made.append(Channel.objects.create(
                name=name, data_dirs=[str(tmp_path / "data")],
                checkpoint_dir=str(tmp_path / name), minimum_required_space=0))
        yield made[0], made[1]
    channels.close_all()


def allowed(role: str | None, scope: str, needed: str, names_channel: bool) -> bool:
    if role is None:
        return False
    if role != needed and role != "admin":
        return False
    return not names_channel or scope != "other"


@pytest.mark.parametrize(("endpoint", "role", "scope"),
                         list(itertools.product(ENDPOINTS, ROLES, SCOPES)),
                         ids=lambda v: v[1] if isinstance(v, tuple) else str(v))
def test_the_permission_matrix(rows: tuple[Channel, Channel], endpoint: tuple[object, ...],
                               role: str | None, scope: str) -> None:
    orders, audit = rows
    method, path, body, needed, names_channel = endpoint
    client = APIClient()
    signed_for = "t0"  # no token: any receipt
    if role is not None:
        limit = None if scope == "all" else [orders if scope == "this" else audit]
        token, key = ApiToken.issue("t", [role], limit)
        client.credentials(HTTP_AUTHORIZATION=f"Bearer {key}")
        signed_for = f"t{token.pk}"
    url = str(path).format(c="orders", r=receipt(orders, 1, signed_for))
    response = getattr(client, str(method))(url, body, format="json")
    if allowed(role, scope, str(needed), bool(names_channel)):
        assert response.status_code < 400, (response.status_code, response.content)
    else:
        assert response.status_code == (401 if role is None else 403), response.content


def test_browser_sessions_need_staff_and_csrf(rows: tuple[Channel, Channel],
                                              django_user_model: object) -> None:
    from django.test import Client

    staff = django_user_model.objects.create_user(  # type: ignore[attr-defined]
        "ops", password="pw", is_staff=True)
    browser = Client(enforce_csrf_checks=True)
    browser.force_login(staff)
    assert browser.get("/api/v1/channels").status_code == 200
    body = '{"events": [{"body": "x"}]}'
    refused = browser.post("/api/v1/channels/orders/events", body,
                           content_type="application/json")
    assert refused.status_code == 403 and "CSRF" in refused.json()["detail"]
    browser.get("/admin/password_change/")  # a form page: sets the CSRF cookie
    token = browser.cookies["csrftoken"].value
    accepted = browser.post("/api/v1/channels/orders/events", body,
                            content_type="application/json", HTTP_X_CSRFTOKEN=token)
    assert accepted.status_code == 200, accepted.content
    plain = django_user_model.objects.create_user("viewer", password="pw")  # type: ignore[attr-defined]
    browser.force_login(plain)
    assert browser.get("/api/v1/channels").status_code == 403
