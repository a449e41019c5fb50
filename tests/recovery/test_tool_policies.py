"""Tool policies (recovery/approvals.py): versions, the namespace's shadowing the global one,
refusals that change nothing, and operators saving at the same moment."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from django.contrib.auth.models import Group
from django.db import connection

from backplane.eventlog.errors import InvalidInput
from recovery import approvals
from recovery.models import ToolPolicy

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def groups() -> None:
    for name in ("Approvers", "Finance leads"):
        Group.objects.get_or_create(name=name)


def set_policy(**values: Any) -> ToolPolicy:
    defaults: dict[str, Any] = {"tool": "payments.transfer", "approver_group": "Approvers", "set_by": "user:olivia",
                                "reason": "the finance team's rule"}
    return approvals.tool_policy_set(**{**defaults, **values})


def test_each_change_is_the_next_version_and_the_earlier_ones_stay_as_they_were() -> None:
    first = set_policy(condition="amount > 1000", field_types={"amount": "number"})
    second = set_policy(condition="amount > 500", field_types={"amount": "number"}, approvals_required=2,
                        reason="lowered after the audit")
    assert (first.version, second.version) == (1, 2)
    first.refresh_from_db()
    assert not first.is_current and first.condition == "amount > 1000" and first.approvals_required == 1
    assert second.is_current and second.set_by == "user:olivia" and second.reason == "lowered after the audit"
    assert ToolPolicy.objects.filter(tool="payments.transfer", is_current=True).get() == second


def test_dispatch_is_told_whether_a_call_needs_approval_and_under_which_version() -> None:
    policy = set_policy(condition="amount > 1000 and currency == 'EUR'",
                        field_types={"amount": "number", "currency": "string"})
    over = approvals.approval_verdict(tool="payments.transfer", namespace="acme",
                                      arguments={"amount": 1200, "currency": "EUR"})
    under = approvals.approval_verdict(tool="payments.transfer", namespace="acme",
                                       arguments={"amount": 800, "currency": "EUR"})
    assert (over.needed, over.policy) == (True, policy)
    assert (under.needed, under.policy) == (False, policy)
    assert not approvals.approval_verdict(tool="search.web", namespace="acme", arguments={}).needed


def test_a_namespaces_policy_shadows_the_global_one_for_that_namespace_only() -> None:
    set_policy(condition="amount > 1000", field_types={"amount": "number"})
    theirs = set_policy(namespace="acme", condition="amount > 10", field_types={"amount": "number"})
    ours = approvals.approval_verdict(tool="payments.transfer", namespace="acme", arguments={"amount": 50})
    assert (ours.needed, ours.policy) == (True, theirs)
    assert not approvals.approval_verdict(tool="payments.transfer", namespace="globex",
                                          arguments={"amount": 50}).needed


def test_a_disabled_version_lets_calls_through_and_keeps_the_history() -> None:
    set_policy()
    off = set_policy(enabled=False, reason="the payments pilot ended")
    verdict = approvals.approval_verdict(tool="payments.transfer", namespace="acme", arguments={"amount": 5})
    assert not verdict.needed and verdict.policy is None
    assert off.version == 2 and ToolPolicy.objects.count() == 2


def test_a_stored_condition_that_no_longer_parses_asks_for_approval() -> None:
    policy = set_policy(condition="amount > 1000", field_types={"amount": "number"})
    ToolPolicy.objects.filter(pk=policy.pk).update(condition="amount >")  # edited by hand in the database
    verdict = approvals.approval_verdict(tool="payments.transfer", namespace="acme", arguments={"amount": 5})
    assert verdict.needed and "refused" in verdict.reason


@pytest.mark.parametrize(("values", "field"), [
    ({"condition": "amount >", "field_types": {"amount": "number"}}, "condition"),
    ({"condition": "amount > 5", "field_types": {}}, "condition"),
    ({"condition": "amount > 5", "field_types": {"amount": "money"}}, "condition"),
    ({"approver_group": "Nobody"}, "approver_group"),
    ({"on_expiry": "escalate"}, "escalate_to"),
    ({"on_expiry": "escalate", "escalate_to": "Nobody"}, "escalate_to"),
    ({"escalate_to": "Finance leads"}, "escalate_to"),
    ({"reason": "  "}, "reason"),
    ({"namespace": "not a namespace!"}, "namespace"),
    ({"approvals_required": 0}, "approvals_required"),
    ({"open_seconds": 1}, "open_seconds"),
    ({"on_expiry": "shrug"}, "on_expiry"),
    ({"tool": "t" * 201}, "tool"),
])
def test_a_refused_policy_says_which_field_and_changes_nothing(values: dict[str, Any], field: str) -> None:
    current = set_policy()
    with pytest.raises(InvalidInput) as refused:
        set_policy(**values)
    assert field in refused.value.details, refused.value.details
    assert list(ToolPolicy.objects.values_list("pk", "version", "is_current")) == [(current.pk, 1, True)]


@pytest.mark.django_db(transaction=True)
def test_operators_saving_at_once_each_write_their_own_version(committed_db: None) -> None:
    Group.objects.get_or_create(name="Approvers")
    saved: list[int] = []
    failures: list[BaseException] = []
    barrier = threading.Barrier(6)

    def save(n: int) -> None:
        try:
            barrier.wait()
            saved.append(set_policy(condition=f"amount > {n}", field_types={"amount": "number"}).version)
        except BaseException as exc:  # noqa: BLE001 - reported below
            failures.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=save, args=(n,)) for n in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not failures
    assert sorted(saved) == [1, 2, 3, 4, 5, 6]
    assert ToolPolicy.objects.filter(is_current=True).get().version == 6


# --- the admin -----------------------------------------------------------------------------------


def admin_form(**values: Any) -> dict[str, Any]:
    approvers = Group.objects.get(name="Approvers")
    return {"tool": "payments.transfer", "namespace": "", "enabled": "on", "condition": "amount > 1000",
            "field_types": '{"amount": "number"}', "approvals_required": 1, "approver_group": approvers.pk,
            "open_seconds": 3600, "on_expiry": "deny", "escalate_to": "", "four_eyes": "on",
            "reason": "set in the admin", **values}


def test_an_administrator_writes_versions_in_the_admin_and_cannot_edit_one(admin_client: Any) -> None:
    add = "/admin/recovery/toolpolicy/add/"
    assert admin_client.post(add, admin_form()).status_code == 302
    first = ToolPolicy.objects.get()
    assert (first.version, first.set_by, first.field_types) == (1, "user:admin", {"amount": "number"})

    page = admin_client.get(f"/admin/recovery/toolpolicy/{first.pk}/change/")
    assert page.status_code == 200 and b"Write the next version from this one" in page.content
    assert b'name="condition"' not in page.content  # read-only: a change is a new version
    prefilled = admin_client.get(f"{add}?tool=payments.transfer&condition=amount+%3E+1000"
                                 "&field_types=%7B%22amount%22%3A+%22number%22%7D")
    assert b"amount &gt; 1000" in prefilled.content and b"&quot;amount&quot;: &quot;number&quot;" in prefilled.content

    assert admin_client.post(add, admin_form(condition="amount > 10")).status_code == 302
    assert list(ToolPolicy.objects.order_by("version").values_list("version", "is_current", "condition")) == [
        (1, False, "amount > 1000"), (2, True, "amount > 10")]
    assert admin_client.post(f"/admin/recovery/toolpolicy/{first.pk}/delete/", {"post": "yes"}).status_code == 403


@pytest.mark.parametrize(("values", "shown"), [
    ({"condition": "amount >"}, b"does not parse"),
    ({"condition": "price > 5"}, b"not a declared field"),
    ({"field_types": '{"amount": "money"}'}, b"unknown type"),
    ({"on_expiry": "escalate"}, b"names the group it escalates to"),
])
def test_the_admin_shows_a_refusal_beside_its_field_and_writes_nothing(
    admin_client: Any, values: dict[str, Any], shown: bytes,
) -> None:
    page = admin_client.post("/admin/recovery/toolpolicy/add/", admin_form(**values))
    assert page.status_code == 200 and shown in page.content, page.content[-2000:]
    assert not ToolPolicy.objects.exists()
