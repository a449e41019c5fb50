"""/api/v1/jobs/: reviewers dry run a bulk action, start it with the list's hash, and watch it."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth.models import Permission, User
from rest_framework.test import APIClient

from backplane.eventlog.models import Task
from recovery import bulk
from recovery.models import BulkJob, BulkJobDecision, BulkJobItem
from tests.api.conftest import AgentClient, assert_error, create_task
from tests.recovery.test_bulk import REASON, failed_task


@pytest.fixture
def reviewer(db: None) -> APIClient:
    user = User.objects.create_user("rita", password="pw", is_staff=True)
    user.user_permissions.add(Permission.objects.get(codename="review_deadletter"))
    client = APIClient()
    client.force_login(user)
    return client


@pytest.fixture
def plain_staff(db: None) -> APIClient:
    client = APIClient()
    client.force_login(User.objects.create_user("sam", password="pw", is_staff=True))
    return client


def job_rows() -> tuple[int, int, int]:
    return BulkJob.objects.count(), BulkJobItem.objects.count(), BulkJobDecision.objects.count()


def dry_run(client: APIClient, **body: Any) -> Any:
    body.setdefault("action", "cancel")
    body.setdefault("reason", REASON)
    return client.post("/api/v1/jobs/", body, format="json")


def test_a_dry_run_answers_the_count_hash_and_a_sample_of_20(reviewer: APIClient, alice: AgentClient) -> None:
    for _ in range(25):
        create_task(alice)
    response = dry_run(reviewer, filter={"namespace": "acme"}, rate_per_second=50)
    assert response.status_code == 201, response.content
    body = response.json()
    job = BulkJob.objects.get()
    assert (body["id"], body["status"], body["total"], body["pending"]) == (job.pk, "draft", 25, 25)
    assert body["selection_hash"] == job.selection_hash and body["created_by"] == "user:rita"
    assert len(body["sample"]) == 20
    assert body["sample"][0] == {"index": 0, "target": job.items.get(index=0).target, "planned": "cancel",
                                 "status": "pending", "detail": "", "finished_at": None}
    assert [d["action"] for d in body["decisions"]] == ["create"]
    assert set(Task.objects.values_list("status", flat=True)) == {"pending"}


@pytest.mark.parametrize(("body", "field"), [
    ({"action": "reboot", "ids": ["3f0c1f9e-8a0e-4a51-9d57-6c1f0f7f2a10"]}, "action"),
    ({"ids": []}, "ids"),
    ({"filter": {"kind": "no-such-kind"}}, "selection"),
    ({"filter": {"status": "bogus"}}, "filter.status"),
    ({"ids": ["3f0c1f9e-8a0e-4a51-9d57-6c1f0f7f2a10"], "reason": ""}, "reason"),
    ({"ids": ["3f0c1f9e-8a0e-4a51-9d57-6c1f0f7f2a10"], "rate_per_second": "fast"}, "rate_per_second"),
    ({"ids": ["3f0c1f9e-8a0e-4a51-9d57-6c1f0f7f2a10"], "colour": "red"}, "colour"),
])
def test_bad_input_is_400_and_writes_nothing(reviewer: APIClient, alice: AgentClient, body: dict[str, Any],
                                              field: str) -> None:
    create_task(alice)
    before = job_rows()
    error = assert_error(dry_run(reviewer, **body), 400, "validation_error")
    assert field in error["details"], error
    assert job_rows() == before


def test_an_over_large_selection_is_400_and_writes_nothing(reviewer: APIClient, alice: AgentClient,
                                                           settings: Any) -> None:
    settings.BACKPLANE_BULK_MAX_ITEMS = 2
    for _ in range(3):
        create_task(alice)
    assert_error(dry_run(reviewer, filter={"namespace": "acme"}), 400, "validation_error")
    assert job_rows() == (0, 0, 0)


def test_agents_and_plain_staff_get_403_and_nothing_changes(reviewer: APIClient, plain_staff: APIClient,
                                                            alice: AgentClient) -> None:
    task = create_task(alice)
    job = bulk.bulk_job_plan(action="cancel", selection={"ids": [task["task_id"]]}, reason=REASON,
                             created_by="rita")
    before = job_rows()
    for client in (alice, plain_staff):
        assert_error(dry_run(client, ids=[task["task_id"]]), 403, "permission_denied")
        assert_error(client.post(f"/api/v1/jobs/{job.pk}/start/", {"selection_hash": job.selection_hash},
                                 format="json"), 403, "permission_denied")
        assert_error(client.get(f"/api/v1/jobs/{job.pk}/"), 403, "permission_denied")
        assert_error(client.get("/api/v1/jobs/"), 403, "permission_denied")
    assert job_rows() == before
    job.refresh_from_db()
    assert job.status == "draft"


def test_start_needs_the_hash_and_happens_once(reviewer: APIClient, alice: AgentClient) -> None:
    created = dry_run(reviewer, ids=[create_task(alice)["task_id"]]).json()
    url = f"/api/v1/jobs/{created['id']}/start/"
    wrong = assert_error(reviewer.post(url, {"selection_hash": "0" * 64}, format="json"), 409, "job_conflict")
    assert wrong["details"] == {"status": "draft", "selection_hash": created["selection_hash"]}
    started = reviewer.post(url, {"selection_hash": created["selection_hash"]}, format="json")
    assert started.status_code == 200 and started.json()["status"] == "running"
    twice = assert_error(reviewer.post(url, {"selection_hash": created["selection_hash"]}, format="json"),
                         409, "job_conflict")
    assert twice["details"]["status"] == "running"
    assert BulkJobDecision.objects.filter(action="start").count() == 1
    assert_error(reviewer.post("/api/v1/jobs/999999/start/", {"selection_hash": "x"}, format="json"),
                 404, "not_found")


def test_pause_resume_abort_and_the_items_as_they_settle(reviewer: APIClient, alice: AgentClient) -> None:
    ids = [create_task(alice)["task_id"] for _ in range(5)]
    created = dry_run(reviewer, ids=ids, chunk_size=2).json()
    base = f"/api/v1/jobs/{created['id']}"
    reviewer.post(f"{base}/start/", {"selection_hash": created["selection_hash"]}, format="json")
    assert bulk.bulk_job_step(created["id"]) == 2
    paused = reviewer.post(f"{base}/pause/", {"reason": "look first"}, format="json").json()
    assert (paused["status"], paused["done"], paused["pending"]) == ("paused", 2, 3)
    assert_error(reviewer.post(f"{base}/pause/", {"reason": "again"}, format="json"), 409, "job_conflict")
    assert_error(reviewer.post(f"{base}/resume/", {}, format="json"), 400, "validation_error")
    assert reviewer.post(f"{base}/resume/", {"reason": "fine"}, format="json").json()["status"] == "running"
    done = reviewer.get(f"{base}/items/", {"status": "done"}).json()
    assert [item["target"] for item in done["results"]] == ids[:2]
    assert done["results"][0]["detail"] == "cancelled" and done["next"] is None
    page = reviewer.get(f"{base}/items/", {"limit": 3}).json()
    assert [item["index"] for item in page["results"]] == [0, 1, 2]
    rest = reviewer.get(page["next"]).json()
    assert [item["index"] for item in rest["results"]] == [3, 4]
    assert_error(reviewer.get(f"{base}/items/", {"status": "bogus"}), 400, "validation_error")
    aborted = reviewer.post(f"{base}/abort/", {"reason": "enough"}, format="json").json()
    assert aborted["status"] == "aborted"
    assert [d["action"] for d in aborted["decisions"]] == ["create", "start", "pause", "resume", "abort"]
    assert reviewer.get("/api/v1/jobs/").json()["results"][0]["id"] == created["id"]


def test_retry_failed_answers_a_new_draft_job(reviewer: APIClient) -> None:
    task = failed_task()
    created = dry_run(reviewer, action="retry", ids=[str(task.pk)]).json()
    BulkJobItem.objects.filter(job_id=created["id"]).update(status="failed", detail="boom")
    BulkJob.objects.filter(pk=created["id"]).update(status="finished", failed=1)
    again = reviewer.post(f"/api/v1/jobs/{created['id']}/retry-failed/", {"reason": "once more"}, format="json")
    assert again.status_code == 201, again.content
    body = again.json()
    assert (body["status"], body["retry_of"], body["total"]) == ("draft", created["id"], 1)
    assert body["sample"][0]["target"] == str(task.pk)
