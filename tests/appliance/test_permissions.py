"""The permission matrix: every endpoint × role × channel scope (and anonymous), checked
against the rule — produce puts, consume takes, admin does everything; a scoped token only
on its channels, and never creates one; nobody anonymous. Then every setting that names a
path, through every verb and scope that may send it: a token scoped to one channel (or one
for all) never reaches another channel's directory, the data root or outside it."""
from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path

import pytest
from appliance_helpers import make_files, problem
from django.test import override_settings
from rest_framework.test import APIClient

from appliance import channels
from appliance.api.takes import receipt
from appliance.models import ApiToken, Channel

pytestmark = pytest.mark.django_db

NEW_CHANNEL = {"name": "fresh", "data_dirs": ["{root}/data"], "checkpoint_dir": "{root}/fresh",
               "minimum_required_space": 0}
# (method, path, body, the role it needs, does it name a channel; ALL: needs every channel)
ALL = "every channel"
ENDPOINTS = [
    ("post", "/api/v1/channels", NEW_CHANNEL, "admin", ALL),
    ("delete", "/api/v1/channels/{c}?force=true", None, "admin", True),
    ("post", "/api/v1/channels/{c}/events", {"events": [{"body": "x"}]}, "produce", True),
    ("post", "/api/v1/channels/{c}/takes", {"max_events": 1}, "consume", True),
    ("post", "/api/v1/channels/{c}/takes/{r}/rollback", None, "consume", True),
    ("get", "/api/v1/channels/{c}", None, "admin", True),
    ("get", "/api/v1/channels/{c}/partitions/0/events?offset=0", None, "admin", True),
    ("patch", "/api/v1/channels/{c}", {"keep_alive_ms": 10}, "admin", True),
    ("post", "/api/v1/channels/{c}/losses/acknowledge", None, "admin", True),
    ("get", "/api/v1/channels/{c}/subscriptions", None, "consume", True),
    ("post", "/api/v1/channels/{c}/subscriptions", {"name": "archive"}, "admin", True),
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
            make_files(made[-1])  # as manage_channels' create makes them
        yield made[0], made[1]
    channels.close_all()


def allowed(role: str | None, scope: str, needed: str, names_channel: object) -> bool:
    if role is None:
        return False
    if role != needed and role != "admin":
        return False
    if names_channel == ALL:
        return scope == "all"
    return not names_channel or scope != "other"


def formatted(body: object, root: Path) -> object:
    """The body with {root} in its strings made the test's data root."""
    if isinstance(body, dict):
        return {key: formatted(value, root) for key, value in body.items()}
    if isinstance(body, list):
        return [formatted(value, root) for value in body]
    return body.replace("{root}", str(root)) if isinstance(body, str) else body


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
    body = formatted(body, Path(orders.checkpoint_dir).parent)
    response = getattr(client, str(method))(url, body, format="json")
    if allowed(role, scope, str(needed), names_channel):
        assert response.status_code < 400, (response.status_code, response.content)
    else:
        if role is None:
            problem(response, 401, "not-authenticated")
            assert response["WWW-Authenticate"] == 'Bearer realm="weir"'
        else:
            problem(response, 403, "permission-denied")


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
    assert "CSRF" in problem(refused, 403, "permission-denied")["detail"]
    browser.get("/admin/password_change/")  # a form page: sets the CSRF cookie
    token = browser.cookies["csrftoken"].value
    accepted = browser.post("/api/v1/channels/orders/events", body,
                            content_type="application/json", HTTP_X_CSRFTOKEN=token)
    assert accepted.status_code == 200, accepted.content
    plain = django_user_model.objects.create_user("viewer", password="pw")  # type: ignore[attr-defined]
    browser.force_login(plain)
    assert browser.get("/api/v1/channels").status_code == 403


# Every setting that names a path, each with values that reach where no channel may: the
# other channel's home, partition and backup dirs, the data root, a parent of another
# channel's home, outside the root, through `..` and through a symlink. {root} is the data
# root; "audit" is the other channel (home {root}/homes/audit, backup {root}/backups/audit).
REACHES = ["{root}", "{root}/homes/audit", "{root}/homes/audit/inner", "{root}/homes",
           "{root}/data/audit-0", "{root}/data", "{root}/backups/audit", "{root}/../outside",
           "{root}/homes/x/../audit", "{root}/link-to-audit", "/etc"]
SHARED = "{root}/data"  # the one exception: data dirs are shared exactly, as Kafka's log.dirs
PATH_BODIES = ([("data_dirs", {"data_dirs": [value]}) for value in REACHES if value != SHARED]
               + [("checkpoint_dir", {"checkpoint_dir": value}) for value in REACHES]
               + [("backup_checkpoint_dir", {"use_dual_checkpoints": True,
                                             "backup_checkpoint_dir": value})
                  for value in REACHES])


@pytest.fixture()
def neighbours(tmp_path: Path) -> Iterator[tuple[Channel, Channel]]:
    """orders and audit, made through the API; audit with a backup dir and a symlink to
    its home at {root}/link-to-audit."""
    from appliance_helpers import token_client

    with override_settings(WEIR_DATA_ROOTS=[tmp_path]):
        admin = token_client("admin")
        for name, extra in (("orders", {}), ("audit", {
                "use_dual_checkpoints": True,
                "backup_checkpoint_dir": str(tmp_path / "backups" / "audit")})):
            made = admin.post("/api/v1/channels", {
                "name": name, "data_dirs": [str(tmp_path / "data")], "partitions": 2,
                "checkpoint_dir": str(tmp_path / "homes" / name), "minimum_required_space": 0,
                **extra}, format="json")
            assert made.status_code == 201, made.content
        (tmp_path / "link-to-audit").symlink_to(tmp_path / "homes" / "audit")
        yield Channel.objects.get(name="orders"), Channel.objects.get(name="audit")
    channels.close_all()


def tree(root: Path) -> list[str]:
    """Every path under root (what a refused request must leave as it was)."""
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


@pytest.mark.parametrize("scope", ["this", "all"])
@pytest.mark.parametrize(("field", "body"), PATH_BODIES,
                         ids=[f"{f}={next(iter(b.values()))}" if f != "backup_checkpoint_dir"
                              else f"{f}={b[f]}" for f, b in PATH_BODIES])
def test_it_refuses_every_path_setting_that_reaches_beyond_the_channel_on_change(
        neighbours: tuple[Channel, Channel], field: str, body: dict[str, object],
        scope: str) -> None:
    orders, _ = neighbours
    root = Path(orders.checkpoint_dir).parent.parent
    client = APIClient()
    _, key = ApiToken.issue("t", ["admin"], None if scope == "all" else [orders])
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {key}")
    before, settings = tree(root), Channel.objects.filter(pk=orders.pk).values().get()
    response = client.patch("/api/v1/channels/orders", formatted(body, root), format="json")
    assert field in problem(response, 400, "invalid-setting")["errors"]
    assert Channel.objects.filter(pk=orders.pk).values().get() == settings
    assert tree(root) == before


@pytest.mark.parametrize(("field", "body"), PATH_BODIES,
                         ids=[f"{f}={next(iter(b.values()))}" if f != "backup_checkpoint_dir"
                              else f"{f}={b[f]}" for f, b in PATH_BODIES])
def test_it_refuses_every_path_setting_that_reaches_beyond_the_channel_on_create(
        neighbours: tuple[Channel, Channel], field: str, body: dict[str, object]) -> None:
    orders, _ = neighbours
    root = Path(orders.checkpoint_dir).parent.parent
    client = APIClient()
    _, key = ApiToken.issue("t", ["admin"], None)
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {key}")
    before = tree(root)
    new = {**formatted(NEW_CHANNEL, root), "checkpoint_dir": str(root / "homes" / "fresh")}
    response = client.post("/api/v1/channels", {**new, **formatted(body, root)}, format="json")
    assert field in problem(response, 400, "invalid-setting")["errors"]
    assert not Channel.objects.filter(name="fresh").exists() and tree(root) == before
    scoped = APIClient()
    _, key = ApiToken.issue("t", ["admin"], [orders])
    scoped.credentials(HTTP_AUTHORIZATION=f"Bearer {key}")
    problem(scoped.post("/api/v1/channels", new, format="json"), 403, "permission-denied")
    assert not Channel.objects.filter(name="fresh").exists() and tree(root) == before
