"""The API against its own OpenAPI schema, fuzzed by schemathesis in process: whatever the
input, no 5xx. (Issue 4 also asks that every response match the schema — statuses,
bodies; the schema does not yet describe every request body and error status, so that
check is the next step, not claimed here.)"""
from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import schemathesis
from django.core.handlers.wsgi import WSGIHandler
from django.test import override_settings
from drf_spectacular.generators import SchemaGenerator
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error

from appliance import channels
from appliance.models import ApiToken, Channel

schema = schemathesis.openapi.from_dict(SchemaGenerator().get_schema(request=None, public=True))
schema.app = WSGIHandler()


@pytest.fixture()
def admin_key(tmp_path: Path) -> Iterator[str]:
    with override_settings(WEIR_DATA_ROOTS=[tmp_path]):
        Channel.objects.create(name="orders", data_dirs=[str(tmp_path / "data")],
                               checkpoint_dir=str(tmp_path / "orders"),
                               minimum_required_space=0)
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
                           checks=[not_a_server_error])
