"""The API against its own OpenAPI schema, fuzzed by schemathesis in process with all of
its default checks: no 5xx, every status, content type, header and body as documented,
schema-valid input accepted and schema-invalid input refused. The only exceptions are in
EXCLUDED, each for one operation, with the business rule JSON Schema cannot express."""
from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import schemathesis
from django.core.handlers.wsgi import WSGIHandler
from django.test import override_settings
from drf_spectacular.generators import SchemaGenerator
from hypothesis import HealthCheck, settings
from schemathesis.checks import CheckFunction
from schemathesis.specs.openapi.checks import positive_data_acceptance

from appliance import channels
from appliance.models import ApiToken, Channel

schema = schemathesis.openapi.from_dict(SchemaGenerator().get_schema(request=None, public=True))
schema.app = WSGIHandler()

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
    # max_events at most this channel's transaction_capacity
    "POST /api/v1/channels/{name}/takes": [positive_data_acceptance],
    # end > start; the partition must exist in this channel
    "GET /api/v1/channels/{name}/partitions/{partition}/batches": [positive_data_acceptance],
}


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
                           excluded_checks=EXCLUDED.get(f"{case.method} {case.path}", []))
