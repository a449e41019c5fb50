"""Roles in the browser: a viewer is offered no operator's control, and a cancel sent all the same
gets the refusal page while the task goes on; a user scoped to one namespace lands on its tasks
and is refused the pages over every namespace."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import User
from playwright.sync_api import Page, expect

from backplane.eventlog import services
from backplane.eventlog.models import Task
from recovery.models import StaffScope
from tests.browser.conftest import csrf_token_of, login, password_hash, path_of
from tests.support.roles import role_group

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

PASSWORD = "amber-finch-ledger-17"
Screenshot = Callable[[Page, str], Path]


def person(username: str, role: str) -> User:
    user = get_user_model().objects.create(username=username, password=password_hash(PASSWORD), is_staff=True)
    assert isinstance(user, User)
    user.groups.add(role_group(role))
    return user


def test_a_viewer_sees_no_operators_controls_and_a_forged_cancel_is_refused(
    page: Page, screenshot: Screenshot
) -> None:
    person("vera", "Viewers")
    task = services.task_create(namespace="acme", kind="lead-qualification", agent="planner", input={}).task
    login(page, "vera", PASSWORD)
    page.goto(f"/tasks/{task.pk}/")
    expect(page.locator("#cancel-task")).to_have_count(0)
    expect(page.locator("#verify-chain")).to_have_count(0)
    screenshot(page, "roles-viewer-task")
    page.goto("/pauses/")
    expect(page.locator("#pause-form")).to_have_count(0)
    expect(page.locator("#pause-form-absent")).to_contain_text("for operators")
    # The page offered nothing, but the server decides: a cancel sent all the same is refused.
    token = csrf_token_of(page)
    with page.expect_navigation():
        page.evaluate("""([action, token]) => {
            const form = Object.assign(document.createElement("form"), {method: "post", action});
            for (const [name, value] of [["csrfmiddlewaretoken", token], ["reason", "looks stuck to me"]]) {
                form.append(Object.assign(document.createElement("input"), {type: "hidden", name, value}));
            }
            document.body.append(form);
            form.submit();
        }""", [f"/tasks/{task.pk}/cancel/", token])
    expect(page.locator("h1")).to_have_text("Not allowed")
    expect(page.locator("main")).to_contain_text("Cancelling a task needs the operate_backplane permission")
    screenshot(page, "roles-viewer-cancel-refused")
    assert Task.objects.get(pk=task.pk).status == "pending"


def test_a_scoped_user_sees_its_namespace_and_not_the_fleet(page: Page, screenshot: Screenshot) -> None:
    user = person("olga", "Operators")
    StaffScope.objects.create(user=user, namespace="acme")
    ours = services.task_create(namespace="acme", kind="lead-qualification", agent="planner", input={}).task
    theirs = services.task_create(namespace="globex", kind="lead-qualification", agent="planner", input={}).task
    login(page, "olga", PASSWORD)
    page.goto("/")
    assert path_of(page.url) == "/tasks/"
    expect(page.locator(f"a[href='/tasks/{ours.pk}/']").first).to_be_visible()
    expect(page.locator(f"a[href='/tasks/{theirs.pk}/']")).to_have_count(0)
    screenshot(page, "roles-scoped-tasks")
    response = page.goto("/dead-letters/")
    assert response is not None and response.status == 403
    expect(page.locator("main")).to_contain_text("covers every namespace")
    expect(page.locator("main")).to_contain_text("Staff scopes")
    screenshot(page, "roles-scoped-refused")
