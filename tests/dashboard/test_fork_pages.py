"""Forks and drift in the dashboard: fork from a task page, lineage, the diff of two histories,
fork from failure in bulk, and sandboxes out of the fleet's figures, through Django's test
client on the real database."""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from backplane.eventlog import forks, services
from backplane.eventlog.models import Event, Task
from backplane.eventlog.writer import EventDraft
from dashboard.selectors.diff import DIFF_EXPAND_MAX, DIFF_PAGE_ITEMS
from dashboard.selectors.overview import activity_per_minute, overview_figures
from dashboard.selectors.task_detail import task_timeline
from recovery import bulk
from recovery.models import BulkJob, BulkJobDecision, BulkJobItem
from tests.dashboard.conftest import html, reviewers_group

SANDBOX_REFUSED = "a sandbox&#x27;s history is a replay; it can only be forked into another sandbox"

def counts() -> tuple[int, int]:
    return Task.objects.count(), Event.objects.count()


def step(task: Task, n: int, **payload: Any) -> None:
    services.event_append(namespace=task.namespace, task_id=task.pk, agent="writer-1",
                          draft=EventDraft(type="ReasoningStepCompleted", payload={"step": n, **payload}))


def steps(task: Task, numbers: range, **payload: Any) -> None:
    """Reasoning steps, a thousand to a batch (the batch limit)."""
    drafts = [EventDraft(type="ReasoningStepCompleted", payload={"step": n, "thought": f"t{n}", **payload})
              for n in numbers]
    for start in range(0, len(drafts), 1000):
        services.event_append_batch(namespace=task.namespace, task_id=task.pk, agent="writer-1",
                                    drafts=drafts[start : start + 1000])


def fail(task: Task, error: str = "the CRM refused the lead") -> None:
    services.event_append(namespace=task.namespace, task_id=task.pk, agent="writer-1",
                          draft=EventDraft(type="TaskFailed", payload={"error": error, "retryable": False}))


def fork_of(source: Task, at_seq: int, *, sandbox: bool = False, reason: str = "replay it") -> Task:
    return forks.task_fork(namespace=None, source_task_id=source.pk, at_seq=at_seq, reason=reason,
                           forked_by="user:setup", by_staff=True, sandbox=sandbox).task


@pytest.fixture
def source(make_task: Callable[..., Task]) -> Task:
    """A task that reasoned three steps (seq 2, 3, 4) after it started; step 2 was formal."""
    task = make_task(kind="outreach", input={"lead": "ada@example.com"})
    step(task, 1, thought="look the lead up")
    step(task, 2, thought="write the mail", tone="formal")
    step(task, 3, thought="send it")
    task.refresh_from_db()
    return task


@pytest.fixture
def drifted(source: Task) -> Task:
    """A fork of ``source`` after step 1 whose step 2 is casual, and whose step 3 is the same."""
    fork = fork_of(source, 2, reason="try a casual tone")
    step(fork, 2, thought="write the mail", tone="casual")
    step(fork, 3, thought="send it")
    fork.refresh_from_db()
    return fork


def post_fork(client: Client, task: Task, **data: Any) -> Any:
    data.setdefault("reason", "retry the mail with the fixed template")
    data.setdefault("fork_id", str(uuid.uuid4()))
    return client.post(f"/tasks/{task.pk}/fork/", data)


def fork_dialog(page: str) -> str:
    match = re.search(r'<dialog id="fork-dialog".*?</dialog>', page, re.S)
    assert match, "no fork dialog on the page"
    return match.group(0)


# --- fork from the page --------------------------------------------------------------------------


def test_it_forks_from_the_page_and_lands_on_the_fork(olivia_client: Client, source: Task) -> None:
    before = list(Event.objects.filter(task=source).values_list("seq", "hash"))
    response = post_fork(olivia_client, source, at_seq=3)
    [fork] = Task.objects.filter(forked_from=source)
    assert response.status_code == 302 and response["Location"] == f"/tasks/{fork.pk}/"
    assert (fork.forked_at_seq, fork.sandbox, fork.kind, fork.status) == (3, False, "outreach", "pending")
    started, forked = Event.objects.filter(task=fork).order_by("seq")
    assert (started.seq, started.type, forked.seq, forked.type) == (1, "TaskStarted", 2, "TaskForked")
    assert forked.payload["forked_by"] == "user:olivia" and forked.payload["by_staff"] is True
    assert forked.payload["reason"] == "retry the mail with the fixed template"
    assert forked.payload["at_seq"] == 3 and forked.payload["source_task_id"] == str(source.pk)
    assert fork.created_by == "user:olivia"
    assert list(Event.objects.filter(task=source).values_list("seq", "hash")) == before

    page = html(olivia_client.get(response["Location"]))
    assert "New fork of outreach" in page
    origin = re.search(r'<div id="fork-origin".*?</div>', page, re.S)
    assert origin and f'href="/tasks/{source.pk}/"' in origin.group(0) and "event 3" in origin.group(0)
    assert f'href="/tasks/{source.pk}/diff/{fork.pk}/#first-divergence"' in page  # compare with source


def test_a_sandbox_forked_from_the_page_is_marked(olivia_client: Client, source: Task) -> None:
    response = post_fork(olivia_client, source, at_seq=2, sandbox="on")
    [fork] = Task.objects.filter(forked_from=source)
    assert response.status_code == 302 and fork.sandbox is True
    assert Event.objects.get(task=fork, seq=2).payload["sandbox"] is True
    page = html(olivia_client.get(f"/tasks/{fork.pk}/"))
    assert 'data-field="sandbox"' in page and "A sandbox of" in page


def test_forking_a_sandbox_into_production_is_refused_on_the_page_and_writes_nothing(
    olivia_client: Client, source: Task
) -> None:
    sandbox = fork_of(source, 2, sandbox=True)
    before = counts()
    response = post_fork(olivia_client, sandbox, at_seq=2)  # the sandbox box left unchecked
    assert response.status_code == 409
    dialog = fork_dialog(html(response))
    assert " open " in dialog.split(">")[0] + " "  # rendered open, with what was sent and why it was refused
    assert SANDBOX_REFUSED in dialog and 'id="fork-error"' in dialog
    assert 'value="retry the mail with the fixed template"' in dialog
    assert counts() == before
    # Rendered at the fork's address: the page's links still lead to the task's page.
    assert f'href="/tasks/{sandbox.pk}/?fork_at=2"' in html(response)


@pytest.mark.parametrize("data, status, words", [
    ({"at_seq": 3, "reason": ""}, 400, "Write a reason"),
    ({"at_seq": 99}, 400, "at_seq must be between 1 and the task&#x27;s last seq, 4"),
    ({"at_seq": 0}, 400, "greater than or equal to 1"),
])
def test_a_bad_fork_is_refused_on_the_page_and_writes_nothing(
    olivia_client: Client, source: Task, data: dict[str, Any], status: int, words: str
) -> None:
    before = counts()
    response = post_fork(olivia_client, source, **data)
    assert response.status_code == status
    assert words in fork_dialog(html(response))
    assert counts() == before


def test_the_same_form_sent_twice_makes_one_fork(olivia_client: Client, source: Task) -> None:
    fork_id = str(uuid.uuid4())
    first = post_fork(olivia_client, source, at_seq=3, fork_id=fork_id)
    before = counts()
    again = post_fork(olivia_client, source, at_seq=3, fork_id=fork_id)
    assert first["Location"] == again["Location"] == f"/tasks/{fork_id}/"
    assert counts() == before
    # Sent again with another event (back, changed, sent): nothing written, a fresh form.
    changed = post_fork(olivia_client, source, at_seq=2, fork_id=fork_id)
    assert changed.status_code == 409 and "already made another fork" in html(changed)
    assert f'value="{fork_id}"' not in fork_dialog(html(changed))
    assert counts() == before


def test_only_staff_fork_and_only_with_the_csrf_token(client: Client, victor: User, olivia: User,
                                                     source: Task) -> None:
    before = counts()
    response = post_fork(client, source, at_seq=2)
    assert response.status_code == 302 and response["Location"].startswith("/login/")
    client.force_login(victor)
    assert post_fork(client, source, at_seq=2).status_code == 403
    checked = Client(enforce_csrf_checks=True)
    checked.force_login(olivia)
    assert post_fork(checked, source, at_seq=2).status_code == 403
    assert counts() == before


def test_every_event_row_and_the_timeline_offer_fork_from_here(olivia_client: Client, source: Task) -> None:
    page = html(olivia_client.get(f"/tasks/{source.pk}/"))
    for seq in range(1, source.last_seq + 1):
        link = f'class="fork-here" data-seq="{seq}" href="/tasks/{source.pk}/?fork_at={seq}"'
        assert re.search(rf'<tr id="seq-{seq}".*?{re.escape(link)}', page, re.S), seq
    assert " open" not in fork_dialog(page).split(">")[0]
    opened = fork_dialog(html(olivia_client.get(f"/tasks/{source.pk}/?fork_at=3")))
    assert " open " in opened.split(">")[0] + " " and 'name="at_seq" value="3"' in opened
    older = html(olivia_client.get(f"/tasks/{source.pk}/?before_seq=4"))
    assert f'href="/tasks/{source.pk}/?before_seq=4&amp;fork_at=2"' in older


def test_the_timelines_bars_carry_the_seq_a_fork_continues_after(make_history: Any) -> None:
    history = make_history()
    calls = [span for span in task_timeline(history.task).spans if span.kind == "tool_call"]
    [done] = [span for span in calls if span.end is not None]
    assert done.last_seq == Event.objects.get(task=history.task, type="ToolCallResultReceived").seq
    [flying] = [span for span in calls if span.end is None]
    dispatched = Event.objects.get(task=history.task, type="ToolCallDispatched", payload__tool="send_email").seq
    assert flying.last_seq == dispatched


# --- lineage ------------------------------------------------------------------------------------


def test_a_source_lists_its_forks_and_a_fork_its_source(olivia_client: Client, source: Task, drifted: Task) -> None:
    sandbox = fork_of(source, 3, sandbox=True)
    page = html(olivia_client.get(f"/tasks/{source.pk}/"))
    listed = re.search(r'<table class="grid compact" id="fork-list">.*?</table>', page, re.S)
    assert listed
    rows = re.findall(r'<tr data-fork-id="([0-9a-f-]+)">(.*?)</tr>', listed.group(0), re.S)
    assert [fork_id for fork_id, _ in rows] == [str(sandbox.pk), str(drifted.pk)]  # newest first
    by_id = dict(rows)
    assert "event 3" in by_id[str(sandbox.pk)] and "badge sandbox" in by_id[str(sandbox.pk)]
    assert "event 2" in by_id[str(drifted.pk)] and "badge sandbox" not in by_id[str(drifted.pk)]
    assert 'class="badge pending"' in by_id[str(drifted.pk)]
    assert f'/tasks/{source.pk}/diff/{drifted.pk}/' in by_id[str(drifted.pk)]

    fork_page = html(olivia_client.get(f"/tasks/{drifted.pk}/"))
    assert "fork of" in fork_page and f'/tasks/{source.pk}/#seq-2' in fork_page
    assert "try a casual tone" in fork_page and "user:setup" in fork_page


def test_the_compare_form_opens_the_diff(olivia_client: Client, source: Task, drifted: Task) -> None:
    response = olivia_client.get(f"/tasks/{source.pk}/compare/", {"other": str(drifted.pk)})
    assert response.status_code == 302
    assert response["Location"] == f"/tasks/{source.pk}/diff/{drifted.pk}/#first-divergence"
    for other, words in (("nope", "enter a task id"), (str(uuid.uuid4()), "no task has the id")):
        refused = olivia_client.get(f"/tasks/{source.pk}/compare/", {"other": other}, follow=True)
        assert words in html(refused)


# --- the diff -----------------------------------------------------------------------------------


def test_the_diff_shows_the_two_histories_aligned_and_the_first_divergence(
    olivia_client: Client, source: Task, drifted: Task
) -> None:
    response = olivia_client.get(f"/tasks/{source.pk}/diff/{drifted.pk}/")
    assert response.status_code == 200
    page = html(response)
    kinds = re.findall(r'<tr id="pair-(\d+)" class="pair kind-(\w+)', page)
    assert kinds == [("0", "same"), ("1", "same"), ("2", "changed"), ("3", "same")]
    first = re.search(r'<tr id="pair-2" class="pair kind-changed first-divergence".*?</tr>', page, re.S)
    assert first, "the first divergence is not highlighted"
    row = first.group(0)
    assert 'id="first-divergence"' in row and "$.payload.tone" in row
    assert "&quot;formal&quot;" in row and "&quot;casual&quot;" in row
    # Each side links into its task's page at the event's row; the fork's step 2 is its seq 3.
    assert f'href="/tasks/{source.pk}/#seq-3"' in row and f'href="/tasks/{drifted.pk}/#seq-3"' in row
    counts_list = re.search(r'<ul class="diff-counts".*?</ul>', page, re.S)
    assert counts_list
    assert re.findall(r"<strong>(\d+)</strong> (same|changed|only in A|only in B)", counts_list.group(0)) == [
        ("3", "same"), ("1", "changed"), ("0", "only in A"), ("0", "only in B")]
    # The events the fork stands on are the source's: shown as recorded there.
    same_step = re.search(r'<tr id="pair-1".*?</tr>', page, re.S)
    assert same_step and f'href="/tasks/{source.pk}/#seq-2"' in same_step.group(0).split('<td class="mid">')[1]


def test_the_diff_of_an_unknown_task_is_404(olivia_client: Client, source: Task) -> None:
    assert olivia_client.get(f"/tasks/{source.pk}/diff/{uuid.uuid4()}/").status_code == 404


def test_two_same_histories_say_so(olivia_client: Client, source: Task) -> None:
    page = html(olivia_client.get(f"/tasks/{source.pk}/diff/{source.pk}/"))
    assert 'id="no-divergence"' in page and 'id="first-divergence"' not in page


def test_a_history_of_ten_thousand_events_is_folded_and_paged(
    olivia_client: Client, make_task: Callable[..., Task]
) -> None:
    long = make_task(kind="research")
    steps(long, range(1, 10_000))
    long.refresh_from_db()
    assert long.last_seq == 10_000
    fork = fork_of(long, 5000)
    step(fork, 4999, thought="another thought")
    response = olivia_client.get(f"/tasks/{long.pk}/diff/{fork.pk}/")
    page = html(response)
    rows = re.findall(r'<tr id="pair-(\d+)" class="pair kind-(\w+)', page)
    folds = re.findall(r'<tr class="fold" id="pair-(\d+)" data-start="\d+" data-end="(\d+)"', page)
    assert len(rows) + len(folds) <= DIFF_PAGE_ITEMS
    # The fork's history is its TaskStarted and the source's steps 1..4999 (pairs 0..4999, the
    # same), then its own step: the first divergence is pair 5000, shown with 3 same before it.
    assert folds[0] == ("0", "4997")
    assert ("5000", "changed") in rows
    assert 'id="first-divergence"' in page and "page 1 of" in page
    pager = re.search(r"page 1 of (\d+)", page)
    assert pager and int(pager.group(1)) > 1
    pages = int(pager.group(1))
    last = html(olivia_client.get(f"/tasks/{long.pk}/diff/{fork.pk}/?page={pages}"))
    assert re.findall(r'<tr id="pair-(\d+)" class="pair kind-only_in_a', last)
    unfolded = html(olivia_client.get(f"/tasks/{long.pk}/diff/{fork.pk}/?page=1&expand=0-4996"))
    shown = re.findall(r'<tr id="pair-(\d+)" class="pair kind-same', unfolded)
    assert shown[: DIFF_EXPAND_MAX] == [str(n) for n in range(DIFF_EXPAND_MAX)]


# --- fork from failure, many at once -------------------------------------------------------------


@pytest.fixture
def failed_three(make_task: Callable[..., Task]) -> list[Task]:
    """Three tasks of kind "enrichment" that reasoned one step (seq 2) and failed (seq 3)."""
    made = []
    for n in range(3):
        task = make_task(kind="enrichment", input={"lead": f"lead-{n}@example.com"})
        step(task, 1, thought="enrich")
        fail(task)
        task.refresh_from_db()
        made.append(task)
    return made


@pytest.fixture
def rita_client(olivia: User) -> Client:
    """A reviewer (staff in the Reviewers group): bulk forks are jobs, and jobs are theirs."""
    rita = User.objects.create_user("rita", is_staff=True)
    rita.groups.add(reviewers_group())
    client = Client()
    client.force_login(rita)
    return client


def job_rows() -> tuple[int, int, int]:
    return BulkJob.objects.count(), BulkJobItem.objects.count(), BulkJobDecision.objects.count()


def draft_fork_job(client: Client, **data: Any) -> BulkJob:
    response = client.post("/tasks/fork-from-failure/", data)
    assert response.status_code == 302, html(response)
    job = BulkJob.objects.latest("pk")
    assert response["Location"] == f"/jobs/{job.pk}/" and job.action == "fork_from_failure"
    return job


def run_to_the_end(job: BulkJob) -> BulkJob:
    while bulk.bulk_job_step(job.pk):
        pass
    job.refresh_from_db()
    return job


def test_the_dry_run_writes_nothing_and_the_job_forks_exactly_the_listed_tasks_once(
    rita_client: Client, failed_three: list[Task], source: Task
) -> None:
    sandbox = fork_of(source, 2, sandbox=True)
    chosen = [failed_three[0], failed_three[1], source, sandbox]
    before = counts()
    job = draft_fork_job(rita_client, reason="the CRM is back", ids=[str(t.pk) for t in chosen],
                         query="status=failed")
    assert counts() == before  # the dry run forks nothing
    assert list(job.items.order_by("index").values_list("target", "planned")) == [
        (str(failed_three[0].pk), "fork from just before its last failure"),
        (str(failed_three[1].pk), "fork from just before its last failure"),
        (str(source.pk), "skip: it never failed"),
        (str(sandbox.pk), "skip: a sandbox is replayed, not forked into production")]
    page = html(rita_client.get(f"/jobs/{job.pk}/"))
    assert "<strong>2</strong> fork from just before its last failure" in page
    assert "will be skipped: it never failed" in page and 'id="job-start"' in page

    assert rita_client.post(f"/jobs/{job.pk}/start/", {"selection_hash": job.selection_hash}).status_code == 302
    job = run_to_the_end(job)
    assert (job.status, job.done, job.skipped, job.failed) == ("finished", 2, 2, 0)
    made = Task.objects.filter(forked_from__isnull=False).exclude(pk=sandbox.pk)
    assert sorted(str(t.forked_from_id) for t in made) == sorted(str(t.pk) for t in failed_three[:2])
    assert {t.forked_at_seq for t in made} == {2}
    assert {Event.objects.get(task=t, seq=2).payload["forked_by"] for t in made} == {"user:rita"}
    done = dict(job.items.filter(status="done").values_list("target", "detail"))
    assert {target: detail.rsplit(" as ", 1)[1] for target, detail in done.items()} == {
        str(t.forked_from_id): str(t.pk) for t in made}

    # A second start (a double click, a resent request) is refused and forks nothing twice.
    after = counts()
    again = rita_client.post(f"/jobs/{job.pk}/start/", {"selection_hash": job.selection_hash})
    assert again.status_code == 409 and counts() == after


def test_all_matching_the_filter_forks_what_the_dry_run_froze(
    rita_client: Client, failed_three: list[Task], make_task: Callable[..., Task]
) -> None:
    make_task(kind="enrichment")  # pending: not matched by status=failed
    other_kind = make_task(kind="billing")
    fail(other_kind)
    job = draft_fork_job(rita_client, reason="retry", all_matching="on", query="status=failed&kind=enrichment")
    assert job.selection == {"filter": {"status": "failed", "kind": "enrichment"}} and job.total == 3
    late = make_task(kind="enrichment")  # fails after the dry run: not in the frozen list
    fail(late)
    rita_client.post(f"/jobs/{job.pk}/start/", {"selection_hash": job.selection_hash})
    run_to_the_end(job)
    forked = set(Task.objects.filter(forked_from__isnull=False).values_list("forked_from_id", flat=True))
    assert forked == {t.pk for t in failed_three}


def test_bad_bulk_fork_input_is_refused_and_plans_nothing(
    rita_client: Client, failed_three: list[Task], settings: Any
) -> None:
    before = (counts(), job_rows())
    refusals = [
        ({"reason": "retry"}, "Select some tasks"),
        ({"ids": [str(failed_three[0].pk)]}, "Write a reason"),
        ({"reason": "retry", "ids": ["not-a-task"]}, "named by their ids"),
        ({"reason": "retry", "all_matching": "on", "query": "status=bogus"}, "filter is not valid"),
        ({"reason": "retry", "all_matching": "on", "query": "kind=no-such-kind"}, "the selection matches nothing"),
    ]
    for data, says in refusals:
        response = rita_client.post("/tasks/fork-from-failure/", data)
        assert response.status_code == 400, data
        assert "Nothing was forked" in html(response) and says in html(response), (data, html(response))
    settings.BACKPLANE_BULK_MAX_ITEMS = 2
    over = rita_client.post("/tasks/fork-from-failure/", {"reason": "retry", "all_matching": "on",
                                                          "query": "status=failed"})
    assert over.status_code == 400 and "more than 2 items" in html(over)
    assert (counts(), job_rows()) == before


def test_bulk_forks_are_for_reviewers_only(olivia_client: Client, failed_three: list[Task]) -> None:
    page = html(olivia_client.get("/tasks/"))
    assert 'id="fork-bulk-form"' not in page and 'name="ids"' not in page
    assert 'id="bulk-viewer-note"' in page and "for reviewers only" in page
    before = (counts(), job_rows())
    refused = olivia_client.post("/tasks/fork-from-failure/", {"reason": "retry",
                                                               "ids": [str(failed_three[0].pk)]})
    assert refused.status_code == 403 and "review_deadletter" in html(refused)
    as_json = olivia_client.post("/tasks/fork-from-failure/", {"reason": "retry", "all_matching": "on"},
                                 HTTP_ACCEPT="application/json")
    assert as_json.status_code == 403 and as_json.json()["error"]["code"] == "permission_denied"
    assert (counts(), job_rows()) == before


def test_a_reviewer_sees_the_bulk_bar(rita_client: Client, failed_three: list[Task]) -> None:
    page = html(rita_client.get("/tasks/"))
    assert 'id="fork-bulk-form"' in page and 'id="bulk-viewer-note"' not in page
    assert all(f'name="ids" value="{t.pk}"' in page for t in failed_three)


# --- sandboxes are no part of the fleet ------------------------------------------------------------


def tile_value(page: str, name: str) -> str:
    match = re.search(rf'data-tile="{name}".*?<div class="tile-value">(.*?)</div>', page, re.S)
    assert match, f"no tile {name}"
    return match.group(1).strip()


def test_sandboxes_are_left_out_of_the_overview_and_the_task_list_by_default(
    olivia_client: Client, source: Task, make_task: Callable[..., Task]
) -> None:
    failed = make_task(kind="enrichment")
    fail(failed)
    sandboxes = [fork_of(source, 2, sandbox=True) for _ in range(2)]
    fail(sandboxes[0])
    figures = overview_figures()
    production = Task.objects.filter(sandbox=False)
    assert figures.tasks_by_status["pending"] == production.filter(status="pending").count() == 1
    assert figures.tasks_by_status["failed"] == 1
    page = html(olivia_client.get("/"))
    assert tile_value(page, "tasks-pending") == "1" and tile_value(page, "tasks-failed") == "1"
    production_events = Event.objects.filter(task__sandbox=False).count()
    assert figures.events_last_minute == production_events < Event.objects.count()
    assert sum(activity_per_minute(hours=1)["series"]["events"]) == production_events

    def listed(query: str = "") -> set[str]:
        return set(re.findall(r'<tr data-task-id="([0-9a-f-]+)"', html(olivia_client.get(f"/tasks/{query}"))))

    assert listed() == {str(source.pk), str(failed.pk)}
    assert listed("?sandboxes=with") == {str(t.pk) for t in Task.objects.all()}
    assert listed("?sandboxes=only") == {str(t.pk) for t in sandboxes}
    assert listed("?status=failed") == {str(failed.pk)}


# --- queries ------------------------------------------------------------------------------------

# The session and its user are two of them on every page; a task's model spend is one more, and
# so is the pause that may hold a pending task back (recovery/selectors.py).
# Each with 3 for who may look (the user's and their groups' permissions, their staff scope); the
# diff looks the scope up for each of its two tasks.
TASK_PAGE_QUERIES = 12 + 3
FORK_PAGE_QUERIES = 13 + 3
DIFF_PAGE_QUERIES = 10 + 6


def queries(client: Client, path: str) -> int:
    with CaptureQueriesContext(connection) as captured:
        assert client.get(path).status_code == 200, path
    return len(captured.captured_queries)


def test_the_task_page_and_the_diff_run_a_bounded_number_of_queries(
    olivia_client: Client, source: Task, drifted: Task
) -> None:
    small = {
        "source": queries(olivia_client, f"/tasks/{source.pk}/"),
        "fork": queries(olivia_client, f"/tasks/{drifted.pk}/"),
        "diff": queries(olivia_client, f"/tasks/{source.pk}/diff/{drifted.pk}/"),
    }
    for _ in range(5):
        fork_of(source, 3, sandbox=True)
    steps(source, range(4, 300))
    steps(drifted, range(4, 300))
    large = {
        "source": queries(olivia_client, f"/tasks/{source.pk}/"),
        "fork": queries(olivia_client, f"/tasks/{drifted.pk}/"),
        "diff": queries(olivia_client, f"/tasks/{source.pk}/diff/{drifted.pk}/"),
    }
    assert large == small
    assert small["source"] <= TASK_PAGE_QUERIES and small["fork"] <= FORK_PAGE_QUERIES
    assert small["diff"] <= DIFF_PAGE_QUERIES
