"""/api/v1/tool-policies/: operators set a tool's approval policy, one version at a time;
viewers read them; agents get neither; a refused policy says why and changes nothing."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth.models import Group
from rest_framework.test import APIClient

from recovery.models import ToolPolicy
from tests.api.conftest import AgentClient, assert_error
from tests.support.roles import staff_user

pytestmark = pytest.mark.django_db

PAYMENTS = {
    "tool": "payments.transfer", "condition": 'amount > 1000 and currency == "EUR"',
    "field_types": {"amount": "number", "currency": "string"}, "approver_group": "Approvers",
    "approvals_required": 2, "open_seconds": 3600, "on_expiry": "escalate", "escalate_to": "Operators",
    "reason": "the finance team's rule from December",
}


def session(username: str, *roles: str) -> APIClient:
    client = APIClient()
    client.force_login(staff_user(username, *roles))
    return client


@pytest.fixture
def operator() -> APIClient:
    Group.objects.get_or_create(name="Approvers")
    return session("olivia", "Operators")


def test_an_operator_sets_a_policy_and_each_change_is_a_new_version(operator: APIClient) -> None:
    first = operator.post("/api/v1/tool-policies/", PAYMENTS, format="json")
    assert first.status_code == 201, first.content
    assert first.json() == {
        **PAYMENTS, "id": first.json()["id"], "namespace": None, "version": 1, "current": True, "enabled": True,
        "four_eyes": True, "set_by": "user:olivia", "created_at": first.json()["created_at"],
    }
    second = operator.post("/api/v1/tool-policies/", {**PAYMENTS, "condition": "amount > 500",
                                                      "field_types": {"amount": "number"}, "reason": "after the audit"},
                           format="json")
    assert (second.status_code, second.json()["version"]) == (201, 2)

    listed = operator.get("/api/v1/tool-policies/").json()["results"]
    assert [(p["tool"], p["version"], p["condition"]) for p in listed] == [("payments.transfer", 2, "amount > 500")]
    earlier = operator.get(f"/api/v1/tool-policies/{first.json()['id']}/").json()
    assert (earlier["current"], earlier["condition"]) == (False, PAYMENTS["condition"])
    versions = operator.get(f"/api/v1/tool-policies/{first.json()['id']}/versions/").json()["results"]
    assert [(v["version"], v["current"], v["reason"]) for v in versions] == [
        (2, True, "after the audit"), (1, False, PAYMENTS["reason"])]


def test_a_namespaces_policy_is_listed_beside_the_global_one(operator: APIClient) -> None:
    for namespace in ("", "acme"):
        assert operator.post("/api/v1/tool-policies/", {**PAYMENTS, "namespace": namespace},
                             format="json").status_code == 201
    listed = operator.get("/api/v1/tool-policies/").json()["results"]
    assert [(p["namespace"], p["version"]) for p in listed] == [(None, 1), ("acme", 1)]


@pytest.mark.parametrize(("change", "field"), [
    ({"condition": "amount >"}, "condition"),
    ({"condition": "amount > 1000 and payee == 'x'"}, "condition"),
    ({"condition": "__import__('os').system('true')"}, "condition"),
    ({"field_types": {"amount": "money"}}, "field_types"),
    ({"field_types": {f"f{n}": "number" for n in range(51)}}, "field_types"),
    ({"approver_group": "Nobody"}, "approver_group"),
    ({"escalate_to": "Nobody"}, "escalate_to"),
    ({"on_expiry": "deny"}, "escalate_to"),
    ({"on_expiry": "shrug"}, "on_expiry"),
    ({"approvals_required": 0}, "approvals_required"),
    ({"approvals_required": "2"}, "approvals_required"),
    ({"four_eyes": "no"}, "four_eyes"),
    ({"open_seconds": 10 ** 12}, "open_seconds"),
    ({"namespace": "not a namespace!"}, "namespace"),
    ({"tool": ""}, "tool"),
    ({"reason": ""}, "reason"),
    ({"surprise": 1}, "surprise"),
])
def test_a_refused_policy_is_400_naming_the_field_and_changes_nothing(
    operator: APIClient, change: dict[str, Any], field: str,
) -> None:
    error = assert_error(operator.post("/api/v1/tool-policies/", {**PAYMENTS, **change}, format="json"),
                         400, "validation_error")
    assert any(key == field or key.startswith(f"{field}.") for key in error["details"]), error
    assert not ToolPolicy.objects.exists()


def test_a_viewer_reads_but_cannot_set(operator: APIClient) -> None:
    policy = operator.post("/api/v1/tool-policies/", PAYMENTS, format="json").json()
    viewer = session("vera", "Viewers")
    assert viewer.get("/api/v1/tool-policies/").status_code == 200
    assert viewer.get(f"/api/v1/tool-policies/{policy['id']}/").status_code == 200
    assert_error(viewer.post("/api/v1/tool-policies/", PAYMENTS, format="json"), 403, "permission_denied")
    assert ToolPolicy.objects.count() == 1


def test_agents_and_reviewers_get_nothing(operator: APIClient, alice: AgentClient) -> None:
    policy = operator.post("/api/v1/tool-policies/", PAYMENTS, format="json").json()
    reviewer = session("rita", "Reviewers")
    for client in (alice, reviewer):
        assert_error(client.post("/api/v1/tool-policies/", PAYMENTS, format="json"), 403, "permission_denied")
    assert_error(alice.get("/api/v1/tool-policies/"), 403, "permission_denied")
    assert_error(alice.get(f"/api/v1/tool-policies/{policy['id']}/"), 403, "permission_denied")
    assert ToolPolicy.objects.count() == 1


def test_an_unknown_version_is_404(operator: APIClient) -> None:
    assert_error(operator.get("/api/v1/tool-policies/999999/"), 404, "not_found")
    assert_error(operator.get("/api/v1/tool-policies/999999/versions/"), 404, "not_found")
