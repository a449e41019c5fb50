"""Logging in and out of the dashboard, and who may see it."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import httpx
import pytest
from django.conf import settings
from django.contrib.auth import get_user_model
from django.test import Client
from playwright.sync_api import Page, expect

from tests.browser.conftest import STAFF_PASSWORD, STAFF_USERNAME, ApiAgent, login, password_hash, path_of
from tests.support.live_server import WebProcess

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

Screenshot = Callable[[Page, str], Path]


@pytest.fixture
def task_path(make_agent: Callable[..., ApiAgent]) -> str:
    return f"/tasks/{make_agent().create_task()['task_id']}/"


def pages(task_path: str) -> list[str]:
    return ["/", "/tasks/", task_path]


def test_it_sends_anonymous_visitors_to_the_login_page(web_server: WebProcess, task_path: str) -> None:
    with httpx.Client(base_url=web_server.url) as http:
        for path in pages(task_path):
            response = http.get(path)
            assert response.status_code == 302, (path, response.status_code)
            location = urlsplit(response.headers["location"])
            assert location.path == "/login/" and parse_qs(location.query) == {"next": [path]}, location


def test_it_logs_in_and_lands_on_the_page_asked_for(
    page: Page, staff_user: object, task_path: str, screenshot: Screenshot
) -> None:
    page.goto(task_path)
    assert path_of(page.url) == "/login/" and parse_qs(urlsplit(page.url).query) == {"next": [task_path]}, page.url
    expect(page.locator("form#login-form")).to_be_visible()
    screenshot(page, "login-next")

    login(page, STAFF_USERNAME, STAFF_PASSWORD)

    assert path_of(page.url) == task_path, page.url
    expect(page.locator("nav.topnav")).to_be_visible()
    expect(page.locator("#task-header")).to_be_visible()
    screenshot(page, "login-landed-on-next")


def test_it_refuses_a_wrong_password(page: Page, staff_user: object, screenshot: Screenshot) -> None:
    page.goto("/login/")
    login(page, STAFF_USERNAME, "not-the-password")
    assert path_of(page.url) == "/login/", page.url
    expect(page.locator(".form-error")).to_be_visible()
    screenshot(page, "login-wrong-password")
    page.goto("/")
    assert path_of(page.url) == "/login/", "a failed login let the visitor in"
    screenshot(page, "login-still-anonymous")


def test_it_logs_out_with_the_nav_form(logged_in_page: Page, screenshot: Screenshot) -> None:
    page = logged_in_page
    page.goto("/tasks/")
    screenshot(page, "before-logout")
    form = page.locator("nav.topnav form#logout-form")
    expect(form).to_have_attribute("method", "post")
    with page.expect_navigation():
        form.locator("[type=submit]").click()
    screenshot(page, "logged-out")
    page.goto("/tasks/")
    assert path_of(page.url) == "/login/", "still logged in after logging out"
    screenshot(page, "logged-out-tasks")


def test_it_forbids_users_who_are_not_staff(
    web_server: WebProcess, page: Page, task_path: str, screenshot: Screenshot
) -> None:
    user = get_user_model().objects.create(username="visitor", password=password_hash(STAFF_PASSWORD), is_staff=False)
    # The session, made here (same database, same secret key as the server): the check under
    # test is the pages', whatever the login form would say.
    client = Client()
    client.force_login(user)
    cookies = {settings.SESSION_COOKIE_NAME: client.cookies[settings.SESSION_COOKIE_NAME].value}
    with httpx.Client(base_url=web_server.url, cookies=cookies) as http:
        for path in pages(task_path):
            assert http.get(path).status_code == 403, path

    # And through the login form, in the browser.
    page.goto("/login/")
    login(page, "visitor", STAFF_PASSWORD)
    screenshot(page, "visitor-logged-in")
    response = page.goto("/")
    assert response is not None
    if path_of(page.url) == "/login/":
        pytest.fail("the login form refused a non-staff user; the contract says the pages answer 403")
    assert response.status == 403, response.status
    expect(page.locator(".tile")).to_have_count(0)
    screenshot(page, "forbidden")


def test_an_unknown_task_is_not_found(logged_in_page: Page, screenshot: Screenshot) -> None:
    response = logged_in_page.goto(f"/tasks/{uuid.uuid4()}/")
    assert response is not None and response.status == 404
    screenshot(logged_in_page, "task-not-found")
