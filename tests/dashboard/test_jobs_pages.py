"""The jobs pages: a dry run from the task list's filter, the job page and its decisions through
the same services as the API, reviewers only for anything that changes a job."""

from __future__ import annotations

from urllib.parse import urlencode

from django.contrib.auth.models import User
from django.test import Client

from backplane.eventlog import services
from backplane.eventlog.models import Task
from recovery import bulk
from recovery.models import BulkJob, BulkJobDecision, BulkJobItem
from tests.dashboard.conftest import html, reviewers_group
from tests.recovery.test_bulk import failed_task


def reviewer_client(user: User) -> Client:
    user.groups.add(reviewers_group())
    client = Client()
    client.force_login(user)
    return client


def job_rows() -> tuple[int, int, int]:
    return BulkJob.objects.count(), BulkJobItem.objects.count(), BulkJobDecision.objects.count()


def test_the_task_list_links_its_filter_to_a_dry_run(olivia: User) -> None:
    client = reviewer_client(olivia)
    page = html(client.get("/tasks/", {"status": "failed", "kind": "enrich"}))
    assert 'id="bulk-action"' in page
    query = urlencode({"status": "failed", "kind": "enrich"})
    new = html(client.get("/jobs/new/", {"query": query}))
    assert "status=failed" in new and "kind=enrich" in new and 'id="job-new-form"' in new


def test_a_dry_run_then_start_runs_exactly_the_list_shown(olivia: User) -> None:
    client = reviewer_client(olivia)
    tasks = [failed_task(kind="enrich") for _ in range(3)]
    response = client.post("/jobs/new/", {"query": "status=failed&kind=enrich", "action": "retry",
                                          "reason": "deploy 412", "rate_per_second": "0",
                                          "chunk_size": "200"})
    job = BulkJob.objects.get()
    assert response.status_code == 302 and response["Location"] == f"/jobs/{job.pk}/"
    page = html(client.get(f"/jobs/{job.pk}/"))
    assert 'id="job-start"' in page and "dry run: nothing has been done yet" in page
    assert 'id="job-planned"' in page and "<strong>3</strong> retry" in page
    assert all(str(task.pk) in page for task in tasks)
    assert job.selection == {"filter": {"status": "failed", "kind": "enrich"}}
    assert client.post(f"/jobs/{job.pk}/start/", {"selection_hash": job.selection_hash}).status_code == 302
    while bulk.bulk_job_step(job.pk):
        pass
    page = html(client.get(f"/jobs/{job.pk}/"))
    assert "finished" in page and 'id="items-done"' in page and "sent back to pending" in page
    assert set(Task.objects.filter(pk__in=[t.pk for t in tasks]).values_list("status", flat=True)) == {"pending"}
    progress = client.get(f"/jobs/{job.pk}/progress/").json()
    assert (progress["status"], progress["done"], progress["pending"], progress["percent"]) == (
        "finished", 3, 0, 100.0)


def test_pause_resume_abort_and_retry_failed_from_the_page(olivia: User) -> None:
    client = reviewer_client(olivia)
    task = services.task_create(namespace="acme", kind="enrich", input={}, agent="planner").task
    job = bulk.bulk_job_plan(action="cancel", selection={"ids": [str(task.pk)]}, reason="r", created_by="user:x")
    client.post(f"/jobs/{job.pk}/start/", {"selection_hash": job.selection_hash})
    assert 'id="job-pause"' in html(client.get(f"/jobs/{job.pk}/"))
    refused = client.post(f"/jobs/{job.pk}/pause/", {"reason": ""})
    assert refused.status_code == 400 and "a reason is required" in html(refused)
    client.post(f"/jobs/{job.pk}/pause/", {"reason": "look"})
    assert 'id="job-resume"' in html(client.get(f"/jobs/{job.pk}/"))
    twice = client.post(f"/jobs/{job.pk}/pause/", {"reason": "again"})
    assert twice.status_code == 409 and "a paused job cannot be paused" in html(twice)
    client.post(f"/jobs/{job.pk}/abort/", {"reason": "enough"})
    job.refresh_from_db()
    assert job.status == "aborted"
    assert list(job.decisions.order_by("at").values_list("action", "decided_by")) == [
        ("create", "user:x"), ("start", "user:olivia"), ("pause", "user:olivia"), ("abort", "user:olivia")]
    BulkJobItem.objects.filter(job=job).update(status="failed", detail="boom")
    BulkJob.objects.filter(pk=job.pk).update(failed=1)
    again = client.post(f"/jobs/{job.pk}/retry-failed/", {"reason": "once more"})
    retry = BulkJob.objects.get(retry_of=job)
    assert again["Location"] == f"/jobs/{retry.pk}/" and retry.status == "draft"
    assert "/jobs/" in html(client.get("/jobs/")) and f"#{retry.pk}" in html(client.get("/jobs/"))


def test_staff_who_are_not_reviewers_see_jobs_but_change_nothing(olivia_client: Client) -> None:
    task = failed_task()
    job = bulk.bulk_job_plan(action="retry", selection={"ids": [str(task.pk)]}, reason="r", created_by="user:x")
    before = job_rows()
    assert olivia_client.get(f"/jobs/{job.pk}/").status_code == 200
    assert 'id="job-start"' not in html(olivia_client.get(f"/jobs/{job.pk}/"))
    assert olivia_client.post("/jobs/new/", {"query": "status=failed", "action": "retry", "reason": "x",
                                             "rate_per_second": "0", "chunk_size": "10"}).status_code == 403
    for decision in ("start", "pause", "resume", "abort", "retry-failed"):
        response = olivia_client.post(f"/jobs/{job.pk}/{decision}/", {"reason": "x",
                                                                     "selection_hash": job.selection_hash})
        assert response.status_code == 403, decision
    assert job_rows() == before
    job.refresh_from_db()
    assert job.status == "draft"
