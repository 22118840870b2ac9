"""The API against its own OpenAPI schema, fuzzed by schemathesis in process with all of
its default checks: no 5xx, every status, content type, header and body as documented,
schema-valid input accepted and schema-invalid input refused. The only exceptions are in
EXCLUDED, each for one operation, with the business rule JSON Schema cannot express.
Then the same schema against a live gunicorn over HTTP: no 5xx, statuses, content types
and bodies as documented (8 examples an operation; 300 under `-m slow`)."""
from __future__ import annotations

import itertools
import json
import os
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import schemathesis
from appliance_helpers import make_files
from django.core.handlers.wsgi import WSGIHandler
from django.test import override_settings
from drf_spectacular.generators import SchemaGenerator
from hypothesis import HealthCheck, settings
from schemathesis.checks import CheckFunction
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    positive_data_acceptance,
    response_schema_conformance,
    status_code_conformance,
)
from test_gunicorn import gunicorn, manage

from appliance import channels
from appliance.models import ApiToken, Channel

OPENAPI = SchemaGenerator().get_schema(request=None, public=True)
schema = schemathesis.openapi.from_dict(OPENAPI)
schema.app = WSGIHandler()
live_schema = schemathesis.openapi.from_dict(OPENAPI)  # sent over HTTP (no app)

# Operation -> checks it cannot pass, and why. positive_data_acceptance expects 2xx for any
# schema-valid request; these operations refuse some of them (400) by documented rules that
# depend on the channel's state or tie fields together, which a JSON Schema cannot say.
EXCLUDED: dict[str, list[CheckFunction]] = {
    # a new channel's settings are checked as a whole by the engine: name pattern,
    # directories under WEIR_DATA_ROOTS, sizes > 0, backup dir with dual checkpoints, ...
    "POST /api/v1/channels": [positive_data_acceptance],
    # the same, plus: name and data_dirs cannot change, partitions cannot shrink
    "PATCH /api/v1/channels/{name}": [positive_data_acceptance],
    # exactly one of offset / timestamp; the partition must exist in this channel
    "GET /api/v1/channels/{name}/partitions/{partition}/events": [positive_data_acceptance],
    # the regex must compile; the partition, and those of cursor/after, must exist in this
    # channel; cursor and after not both
    "GET /api/v1/channels/{name}/events": [positive_data_acceptance],
    # max_events at most this channel's transaction_capacity
    "POST /api/v1/channels/{name}/takes": [positive_data_acceptance],
    # the partitions of "offsets" must exist in this channel, each offset inside its log
    "POST /api/v1/channels/{name}/subscriptions": [positive_data_acceptance],
    "POST /api/v1/channels/{name}/subscriptions/{sub}/reset": [positive_data_acceptance],
    # 409 unless the channel's files are missing (a volume not mounted)
    "POST /api/v1/channels/{name}/recreate": [positive_data_acceptance],
    # end > start; the partition must exist in this channel
    "GET /api/v1/channels/{name}/partitions/{partition}/batches": [positive_data_acceptance],
}


@pytest.fixture()
def admin_key(tmp_path: Path) -> Iterator[str]:
    with override_settings(WEIR_DATA_ROOTS=[tmp_path]):
        make_files(Channel.objects.create(name="orders", data_dirs=[str(tmp_path / "data")],
                                          checkpoint_dir=str(tmp_path / "orders"),
                                          minimum_required_space=0))
        yield ApiToken.issue("fuzz", ["admin"])[1]
    channels.close_all()


@pytest.mark.django_db(transaction=True)
@schema.parametrize()
@settings(max_examples=20, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                 HealthCheck.filter_too_much])
def test_the_api_keeps_its_schema(case: schemathesis.Case, admin_key: str) -> None:
    if "name" in (case.path_parameters or {}):
        case.path_parameters["name"] = "orders"
    case.call_and_validate(headers={"Authorization": f"Bearer {admin_key}"},
                           excluded_checks=EXCLUDED.get(f"{case.method} {case.path}", []))



# -- against a live server ------------------------------------------------------------------
# The same schema, every operation sent over HTTP to a real gunicorn (the middleware, the
# WSGI server's parsing and the engine's owner process in the path), with the checks that
# hold for any request: no server error, and every status, content type and body as
# documented. A fuzzed PATCH may pause puts or shrink a channel: a 503 or 507 with
# Retry-After is then the documented answer, not a server error.
@schemathesis.check
def no_server_error(ctx: Any, response: Any, case: schemathesis.Case) -> bool:
    """No 5xx except the documented, retryable 503 / 507 (with Retry-After)."""
    status = response.status_code
    if status >= 500 and not (status in (503, 507) and "Retry-After" in response.headers):
        raise AssertionError(f"server error {status}: {response.text[:2000]}")
    return True


LIVE_CHECKS: list[CheckFunction] = [no_server_error, status_code_conformance,
                                    content_type_conformance, response_schema_conformance]


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str, Path]]:
    """A gunicorn, an admin key and its data root."""
    tmp = tmp_path_factory.mktemp("live")
    env = {**os.environ, "WEIR_VAR_DIR": str(tmp / "var"),
           "WEIR_DATA_ROOT": str(tmp / "channels")}
    env.pop("DATABASE_URL", None)
    manage(env, "migrate", "--noinput")
    key = manage(env, "create_token", "fuzz", "--role", "admin").strip().splitlines()[-1]
    with gunicorn(env, workers=2) as url:
        yield url, key, tmp / "channels"


def _channel_exists(url: str, key: str, root: Path, name: str, resume: bool) -> None:
    """Create a channel unless it is there (409); `resume`: its puts resumed (a fuzzed
    PATCH may have paused them; a change makes every worker reopen, so only then)."""
    body = json.dumps({"name": name, "data_dirs": [str(root / f"{name}-data")],
                       "checkpoint_dir": str(root / name), "minimum_required_space": 0,
                       "partitions": 2}).encode()
    headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
    try:
        urllib.request.urlopen(urllib.request.Request(
            f"{url}/api/v1/channels", data=body, headers=headers), timeout=30).close()
    except urllib.error.HTTPError as exc:
        assert exc.code == 409, exc.read()
    if resume:
        urllib.request.urlopen(urllib.request.Request(
            f"{url}/api/v1/channels/{name}", data=b'{"puts_paused": false}', headers=headers,
            method="PATCH"), timeout=30).close()


def _call_live(case: schemathesis.Case, live: tuple[str, str, Path]) -> None:
    url, key, root = live
    name = "orders"
    if case.method == "DELETE":  # a channel of its own each time, never "orders"
        name = f"gone-{next(_deleted)}"
    _channel_exists(url, key, root, name,
                    resume=name == "orders" and _patched.pop("orders", False))
    if "name" in (case.path_parameters or {}):
        case.path_parameters["name"] = name
    if case.method == "PATCH":
        _patched["orders"] = True
    case.call_and_validate(base_url=url, headers={"Authorization": f"Bearer {key}"},
                           checks=LIVE_CHECKS, timeout=60)


_deleted = itertools.count()
_patched: dict[str, bool] = {}
_LIVE_HEALTH = [HealthCheck.too_slow, HealthCheck.filter_too_much]


@pytest.mark.own_sqlite  # its gunicorn runs on a SQLite database of its own
@live_schema.parametrize()
@settings(max_examples=8, deadline=None, suppress_health_check=_LIVE_HEALTH)
def test_it_keeps_its_schema_on_a_live_server(case: schemathesis.Case,
                                              live: tuple[str, str, Path]) -> None:
    _call_live(case, live)


@pytest.mark.own_sqlite  # its gunicorn runs on a SQLite database of its own
@pytest.mark.slow
@live_schema.parametrize()
@settings(max_examples=300, deadline=None, suppress_health_check=_LIVE_HEALTH)
def test_it_keeps_its_schema_on_a_live_server_many_examples(
        case: schemathesis.Case, live: tuple[str, str, Path]) -> None:
    _call_live(case, live)
