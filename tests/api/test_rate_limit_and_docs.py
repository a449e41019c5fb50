"""Per-principal rate limit, the OpenAPI schema and offline interactive docs."""

from __future__ import annotations

import math
import re
import time

import pytest
from rest_framework.test import APIClient

from tests.api.conftest import assert_error, create_task


def seconds_left_in_the_minute() -> float:
    return 60 - time.time() % 60


@pytest.mark.parametrize("route", ["/api/v1/tasks/", "/api/v1/tasks/{task}/"], ids=["drf", "agent-route"])
def test_every_429_gives_the_seconds_left_in_the_window(alice, mallory, settings, route) -> None:  # type: ignore[no-untyped-def]
    settings.BACKPLANE_RATE_LIMIT = "5/m"
    if seconds_left_in_the_minute() < 5:  # the five requests below must share one window
        time.sleep(seconds_left_in_the_minute() + 0.05)
    url = route.format(task=create_task(alice)["task_id"])  # one
    for _ in range(4):
        assert alice.get(url).status_code == 200
    before = seconds_left_in_the_minute()
    limited = alice.get(url)
    after = seconds_left_in_the_minute()
    error = assert_error(limited, 429, "rate_limited")
    retry_after = int(limited["Retry-After"])
    # Whole seconds rounded up: at least what is left of the window, and not a second more.
    assert math.floor(after) <= retry_after <= math.ceil(before), (before, retry_after, after)
    assert error["details"]["retry_after"] == retry_after
    assert mallory.get("/api/v1/tasks/").status_code == 200  # another token, another counter


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
