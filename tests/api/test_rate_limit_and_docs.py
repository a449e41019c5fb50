"""Per-token rate limit, the OpenAPI schema and offline interactive docs."""

from __future__ import annotations

import re

import pytest
from django.core.cache import cache
from rest_framework.test import APIClient

from tests.api.conftest import assert_error


@pytest.fixture(autouse=True)
def fresh_buckets(db):  # type: ignore[no-untyped-def]
    # The buckets live in the shared cache, by default a table in the database.
    cache.clear()
    yield
    cache.clear()


def test_the_rate_limit_is_per_token_with_retry_after(alice, mallory, settings) -> None:  # type: ignore[no-untyped-def]
    settings.BACKPLANE_RATE_LIMIT = "5/m"
    for _ in range(5):
        assert alice.get("/api/v1/tasks/").status_code == 200
    limited = alice.get("/api/v1/tasks/")
    error = assert_error(limited, 429, "rate_limited")
    assert 1 <= int(limited["Retry-After"]) <= 60 and error["details"]["retry_after"] == int(limited["Retry-After"])
    assert mallory.get("/api/v1/tasks/").status_code == 200  # another token, another bucket


def test_the_schema_describes_every_route_and_the_error_shape(db) -> None:  # type: ignore[no-untyped-def]
    response = APIClient().get("/api/schema/", HTTP_ACCEPT="application/vnd.oai.openapi+json")
    assert response.status_code == 200
    schema = response.json()
    paths = set(schema["paths"])
    for path in [
        "/api/v1/tasks/", "/api/v1/tasks/{task_id}/", "/api/v1/tasks/{task_id}/events/",
        "/api/v1/tasks/{task_id}/events/batch/", "/api/v1/tasks/{task_id}/verify/", "/api/v1/leases/",
        "/api/v1/tasks/{task_id}/heartbeat/", "/api/v1/tasks/{task_id}/release/",
        "/api/v1/tasks/{task_id}/recovery-context/", "/api/v1/tasks/{task_id}/tool-calls/",
        "/api/v1/tool-calls/{key}/", "/api/v1/tool-calls/{key}/result/", "/api/v1/tasks/{task_id}/subtasks/",
    ]:
        assert path in paths, path
    append = schema["paths"]["/api/v1/tasks/{task_id}/events/"]["post"]
    assert {"200", "201", "400", "401", "404", "409", "413", "422", "429"} <= set(append["responses"])
    assert schema["components"]["schemas"]["ErrorOut"]["properties"]["error"]
    assert schema["components"]["schemas"]["EventAppendInRequest"]["additionalProperties"] is False
    assert schema["components"]["securitySchemes"]["agentToken"]["scheme"] == "bearer"


def test_the_docs_page_loads_its_assets_from_this_server(db) -> None:  # type: ignore[no-untyped-def]
    client = APIClient()
    page = client.get("/api/docs/")
    assert page.status_code == 200
    html = page.content.decode()
    assets = re.findall(r'(?:src|href)="([^"]+)"', html)
    assert assets, html
    for asset in assets:
        assert not asset.startswith(("http://", "https://", "//")), f"external asset {asset}"
        if asset.endswith((".js", ".css")):
            assert client.get(asset).status_code == 200, asset
