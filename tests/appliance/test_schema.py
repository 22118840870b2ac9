"""The OpenAPI schema is served and valid, and its Swagger UI needs no CDN."""
from __future__ import annotations

import pytest
from django.core.management import call_command
from django.test import Client

pytestmark = pytest.mark.django_db


def test_the_schema_generates_without_warnings(tmp_path: object) -> None:
    call_command("spectacular", "--validate", "--fail-on-warn", "--file",
                 str(tmp_path) + "/schema.yml")


def test_swagger_ui_is_served_locally(admin_client: Client) -> None:
    page = admin_client.get("/api/docs/").content.decode()
    assert "swagger-ui" in page and "cdn" not in page.lower()
    assert admin_client.get("/api/schema/").status_code == 200


def test_it_documents_that_the_runs_filters_refuse_nul() -> None:
    # DRF answers 400 to a NUL in a CharField: the schema must not call it valid input.
    import re

    from drf_spectacular.generators import SchemaGenerator

    schema = SchemaGenerator().get_schema(request=None, public=True)
    for parameter in schema["paths"]["/api/v1/runs"]["get"]["parameters"]:
        if parameter["name"] in ("channel", "task"):
            text = next(choice for choice in parameter["schema"]["oneOf"]
                        if "pattern" in choice)  # the other choice: blank
            pattern = re.compile(text["pattern"])
            assert pattern.search("flusher") and not pattern.search("flu\x00sher")


def test_every_query_parameter_the_api_accepts_empty_is_valid_empty_in_the_schema() -> None:
    # drf-spectacular renders an allow_blank filter as oneOf [its schema, maxLength 0]:
    # "" must match exactly one, or schema-true clients (schemathesis) think it invalid.
    from drf_spectacular.generators import SchemaGenerator
    from jsonschema import Draft202012Validator

    schema = SchemaGenerator().get_schema(request=None, public=True)
    checked = []
    for path, operations in schema["paths"].items():
        for method, operation in operations.items():
            for parameter in operation.get("parameters", []):
                if parameter["in"] == "query" and "oneOf" in parameter["schema"]:
                    errors = list(Draft202012Validator(parameter["schema"]).iter_errors(""))
                    assert not errors, (method, path, parameter["name"], errors[0].message)
                    checked.append(parameter["name"])
    assert {"channel", "task"} <= set(checked)
