"""Browser tests: Debian's chromium, driven by Playwright's sync API, against real web processes.

- The browser is ``chromium`` from apt (``make browser`` installs it; ``BACKPLANE_CHROMIUM``
  names another binary). Playwright's own browser download is never used. One browser per
  package run, in one context (its cache keeps Plotly compiled) whose cookies are cleared before
  each test, and a new page per test; Playwright gives every launch a fresh temporary
  ``--user-data-dir``.
- ``web_server`` is the product's web process exactly as ``make run`` starts it
  (``tests/support/live_server.py``) against pytest-django's test database; ``web_processes``
  starts more (another port, same database) that a test may kill and start again.
- Every test runs with committed data (``committed_db``), so the server sees what the test
  writes and the other way round; the test writes through the REST API (``make_agent``) like an
  agent would, and reads the database to check what the pages show.
- ``logged_in_page`` is logged in as a plain staff user (a viewer), ``reviewer_page`` as one in
  the Reviewers group (who decides dead letters); each logs in with the form once per package.
- ``screenshot(page, name)`` saves a full-page PNG as ``var/screenshots/<name>.png``.

Playwright's sync API keeps an asyncio event loop running in this thread while it is started.
Django refuses ORM calls from a thread with a running loop (``SynchronousOnlyOperation``), a
check meant for async views, not for a test that talks to the database between browser steps.
So ``DJANGO_ALLOW_ASYNC_UNSAFE`` is set while this package runs, and Playwright is stopped at
the end of the package so that no other test runs beside its loop. The web processes never
inherit the variable (``tests/support/live_server.py`` drops it).
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit

import httpx
import pytest
from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.hashers import make_password
from django.contrib.auth.models import AbstractUser, Group
from django.contrib.sessions.models import Session
from playwright.sync_api import Browser, BrowserContext, Page, Playwright, ViewportSize, expect, sync_playwright

from backplane.eventlog import services
from tests.support.live_server import ROOT, WebProcess
from tests.support.roles import role_group

SCREENSHOT_DIR = ROOT / "var" / "screenshots"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
VIEWPORT: ViewportSize = {"width": 1440, "height": 900}
# Operators are rarely in UTC; a half-hour offset shows a time handled in the wrong zone.
TIMEZONE = "Asia/Kolkata"
LoadState = Literal["commit", "domcontentloaded", "load", "networkidle"]
STAFF_USERNAME = "operator"
STAFF_PASSWORD = "grey-heron-lantern-42"
STAFF_USER_ID = 4242


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]):  # type: ignore[no-untyped-def]
    # Kept on the item so the ``page`` fixture can save what a failing test was looking at.
    report = yield
    setattr(item, f"report_{report.when}", report)
    return report


def chromium_executable() -> str:
    path = os.environ.get("BACKPLANE_CHROMIUM") or shutil.which("chromium")
    if not path:
        pytest.fail("chromium is not installed: `make browser` installs Debian's (or set BACKPLANE_CHROMIUM)")
    return path


# --- the browser ----------------------------------------------------------------------------


@pytest.fixture(scope="package")
def allow_orm_beside_playwright() -> Iterator[None]:
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
        yield


@pytest.fixture(scope="package")
def playwright(allow_orm_beside_playwright: None) -> Iterator[Playwright]:
    with sync_playwright() as instance:
        yield instance


@pytest.fixture(scope="package")
def browser(playwright: Playwright) -> Iterator[Browser]:
    SCREENSHOT_DIR.mkdir(parents=True, exist_ok=True)
    browser = playwright.chromium.launch(executable_path=chromium_executable(), headless=True, args=CHROMIUM_ARGS)
    yield browser
    browser.close()


@pytest.fixture(scope="package")
def shared_context(browser: Browser, web_server: WebProcess) -> Iterator[BrowserContext]:
    # One context for the package keeps its HTTP cache, and with it V8's compiled Plotly (4.8 MB):
    # a page with a chart loads in a fraction of the time a fresh context takes. The pages keep
    # nothing in the browser's storage; cookies are cleared before each test.
    context = browser.new_context(base_url=web_server.url, viewport=VIEWPORT, timezone_id=TIMEZONE)
    yield context
    context.close()


@pytest.fixture
def context(shared_context: BrowserContext) -> BrowserContext:
    """The browser, with no cookies: not logged in."""
    shared_context.clear_cookies()
    return shared_context


@pytest.fixture
def page(context: BrowserContext, request: pytest.FixtureRequest) -> Iterator[Page]:
    """A page that records uncaught JavaScript errors; none may happen. A failing test leaves
    ``var/screenshots/FAILED-<test>.png``."""
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(f"{page.url}: {error}"))
    yield page
    report = getattr(request.node, "report_call", None)
    if report is not None and report.failed and not page.is_closed():
        try:
            page.screenshot(path=str(SCREENSHOT_DIR / f"FAILED-{_safe_name(request.node.name)}.png"), full_page=True)
        except Exception:  # noqa: BLE001 - diagnostics only; the test has failed already
            pass
    page.close()
    assert not errors, "uncaught JavaScript errors:\n" + "\n".join(errors)


def _safe_name(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", name).strip("-")


@pytest.fixture
def screenshot() -> Callable[[Page, str], Path]:
    def save(page: Page, name: str) -> Path:
        path = SCREENSHOT_DIR / f"{_safe_name(name)}.png"
        page.screenshot(path=str(path), full_page=True)
        return path

    return save


# --- web processes --------------------------------------------------------------------------


@pytest.fixture(scope="package")
def web_server(django_db_setup: None, allow_orm_beside_playwright: None) -> Iterator[WebProcess]:
    """The web process most tests use, for the whole package; it stops before the test
    database is dropped (it depends on ``django_db_setup``)."""
    server = WebProcess(name="browser-web")
    try:
        yield server.start()
    finally:
        server.close()


@pytest.fixture
def web_processes(django_db_setup: None) -> Iterator[Callable[..., WebProcess]]:
    """Start more web processes on the test database: ``web_processes(name=..., port=None,
    env=None)``, ``env`` on top of the suite's. A test may ``kill()`` and ``start()`` them
    again; all are stopped afterwards."""
    started: list[WebProcess] = []

    def start(*, name: str = "web", port: int | None = None, env: dict[str, str] | None = None) -> WebProcess:
        server = WebProcess(port, name=name, env=env)
        started.append(server)
        return server.start()

    yield start
    logs = {server.name: server.log() for server in started}
    for server in started:
        server.close()
    for name, log in logs.items():
        assert "Traceback" not in log and " ERROR " not in log, f"{name}:\n{log[-6000:]}"


@pytest.fixture(autouse=True)
def _committed_and_quiet(committed_db: None, web_server: WebProcess) -> Iterator[None]:
    """Every browser test works on committed data, and leaves no error in the server's log."""
    since = web_server.log_size()
    yield
    log = web_server.log(since)
    assert "Traceback" not in log and " ERROR " not in log, log[-6000:]


# --- users and logging in -------------------------------------------------------------------


@functools.cache
def password_hash(password: str) -> str:
    # Hashed once per run (PBKDF2 takes about half a second here), then stored in each new user.
    return make_password(password)


@pytest.fixture
def staff_user(committed_db: None) -> AbstractUser:
    """The staff user, an operator (the Operators group), with the same id and password hash in
    every test (see ``logged_in_page``)."""
    user = get_user_model().objects.create(
        pk=STAFF_USER_ID, username=STAFF_USERNAME, email="operator@example.com",
        password=password_hash(STAFF_PASSWORD), is_staff=True,
    )
    assert isinstance(user, AbstractUser)
    user.groups.add(role_group("Operators"))
    return user


def path_of(url: str) -> str:
    return urlsplit(url).path


def login(page: Page, username: str, password: str, *, wait_until: LoadState = "load") -> None:
    """Fill in and submit the product's login form (on the page already, or at ``/login/``)."""
    if path_of(page.url) != "/login/":
        page.goto("/login/")
    form = page.locator("form#login-form")
    form.locator("input[name=username]").fill(username)
    form.locator("input[name=password]").fill(password)
    with page.expect_navigation(wait_until=wait_until):
        form.locator("button[type=submit]").click()


@dataclass
class SavedLogin:
    cookies: list[Any]
    session: Mapping[str, Any]


@pytest.fixture(scope="package")
def saved_login() -> dict[str, SavedLogin]:
    return {}


@pytest.fixture
def logged_in_page(page: Page, staff_user: AbstractUser, saved_login: dict[str, SavedLogin]) -> Page:
    """A page logged in as the staff user through the login form at ``/login/`` (a blank page,
    or the overview: a test goes where it needs to; test_login.py checks the landing itself).

    The first test of the package logs in with the form. Each test's data is flushed after it,
    session included, so the later ones put that session's row back (the user has the same id
    and password hash every time, so it is still valid) and give the browser its cookies: the
    server checks a password with PBKDF2 once, not once per test.
    """
    return log_in_once(page, "staff", STAFF_USERNAME, STAFF_PASSWORD, saved_login)


def log_in_once(page: Page, key: str, username: str, password: str, saved_login: dict[str, SavedLogin]) -> Page:
    """Log ``page`` in as ``username``: with the form the first time in the package, then with
    that login's session row and cookies put back (``saved_login[key]``; see ``logged_in_page``)."""
    if key in saved_login:
        saved = saved_login[key]
        Session.objects.create(**saved.session)
        page.context.add_cookies(saved.cookies)
        return page
    page.goto("/login/")
    login(page, username, password, wait_until="commit")
    assert path_of(page.url) == "/", page.url
    if settings.SESSION_ENGINE == "django.contrib.sessions.backends.db":
        cookies = page.context.cookies()
        [session_key] = [c["value"] for c in cookies if c["name"] == settings.SESSION_COOKIE_NAME]
        row = Session.objects.values("session_key", "session_data", "expire_date").get(session_key=session_key)
        saved_login[key] = SavedLogin(cookies=list(cookies), session=row)
    return page


# --- reviewers: staff in the "Reviewers" group, who decide dead letters and close breakers -----

REVIEWER_USERNAME = "rita"
REVIEWER_PASSWORD = "amber-kestrel-harbour-17"
REVIEWER_USER_ID = 4243
REVIEW_PERMISSION = "review_deadletter"


def reviewers_group() -> Group:
    """The group migrations make; the flush after each test removes it, so it is put back."""
    return role_group("Reviewers")


@pytest.fixture
def reviewer_user(committed_db: None) -> AbstractUser:
    """A reviewer: staff, in the Reviewers group; the same id and password hash in every test."""
    user = get_user_model().objects.create(
        pk=REVIEWER_USER_ID, username=REVIEWER_USERNAME, email="rita@example.com",
        password=password_hash(REVIEWER_PASSWORD), is_staff=True,
    )
    assert isinstance(user, AbstractUser)
    user.groups.add(reviewers_group())
    return user


@pytest.fixture
def reviewer_page(page: Page, reviewer_user: AbstractUser, saved_login: dict[str, SavedLogin]) -> Page:
    """A page logged in as the reviewer (see ``logged_in_page``)."""
    return log_in_once(page, "reviewer", REVIEWER_USERNAME, REVIEWER_PASSWORD, saved_login)


def csrf_token_of(page: Page) -> str:
    """The CSRF token a loaded page of the dashboard carries (every page has the logout form)."""
    return page.locator("#logout-form input[name=csrfmiddlewaretoken]").input_value()


def wait_live(page: Page, timeout: float = 10_000) -> None:
    """Wait until the page's socket is up (``#live-status[data-state=connected]``)."""
    expect(page.locator("#live-status")).to_have_attribute("data-state", "connected", timeout=timeout)


def scrolled_to_top(page: Page) -> Page:
    """Scroll back up before a full-page screenshot, or the sticky nav is drawn where the page was."""
    page.evaluate("window.scrollTo(0, 0)")
    return page


def mark_document(page: Page) -> None:
    """Leave a mark on the loaded document; ``assert_not_reloaded`` fails if it is gone."""
    page.evaluate("window.__backplaneNoReload = true")


def assert_not_reloaded(page: Page) -> None:
    assert page.evaluate("window.__backplaneNoReload === true"), "the page was reloaded"


# --- the REST API, as an agent --------------------------------------------------------------


class ApiAgent:
    """An agent with a real token, talking to one web process over HTTP (``docs/api.md``)."""

    def __init__(self, *, name: str, namespace: str, token: str, server: WebProcess) -> None:
        self.name, self.namespace, self.token, self.server = name, namespace, token, server
        self.http = httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {token}"}, timeout=10)
        self._others: list[ApiAgent] = []

    def via(self, server: WebProcess) -> ApiAgent:
        """The same agent, talking to another web process."""
        other = ApiAgent(name=self.name, namespace=self.namespace, token=self.token, server=server)
        self._others.append(other)
        return other

    def close(self) -> None:
        for other in self._others:
            other.close()
        self.http.close()

    def call(self, method: str, path: str, expect_status: int | tuple[int, ...] = (200, 201), **kwargs: Any) -> Any:
        response = self.http.request(method, path, **kwargs)
        allowed = (expect_status,) if isinstance(expect_status, int) else expect_status
        assert response.status_code in allowed, f"{method} {path}: {response.status_code} {response.text}"
        return response.json() if response.content else None

    def create_task(self, kind: str = "lead-qualification", input: dict[str, Any] | None = None,
                    **body: Any) -> dict[str, Any]:
        body.update(kind=kind, input=input if input is not None else {"lead": "alice@example.com"})
        return self.call("POST", "/api/v1/tasks/", 201, json=body)

    def get_task(self, task_id: str) -> dict[str, Any]:
        return self.call("GET", f"/api/v1/tasks/{task_id}/", 200)

    def append(self, task_id: str, type: str, payload: dict[str, Any] | None = None, **body: Any) -> dict[str, Any]:
        body.update(type=type, payload=payload or {})
        return self.call("POST", f"/api/v1/tasks/{task_id}/events/", 201, json=body)

    def events(self, task_id: str) -> list[dict[str, Any]]:
        return self.call("GET", f"/api/v1/tasks/{task_id}/events/", 200, params={"limit": 1000})["results"]

    def claim(self, kinds: list[str] | None = None, lease_seconds: int = 60) -> dict[str, Any]:
        body: dict[str, Any] = {"lease_seconds": lease_seconds}
        if kinds is not None:
            body["kinds"] = kinds
        return self.call("POST", "/api/v1/leases/", 200, json=body)

    def tool_call(self, task_id: str, *, step: int, tool: str, lease_epoch: int, input: dict[str, Any] | None = None,
                  compensation: dict[str, Any] | None = None) -> dict[str, Any]:
        body: dict[str, Any] = {"step": step, "tool": tool, "input": input or {}, "lease_epoch": lease_epoch}
        if compensation is not None:
            body["compensation"] = compensation
        return self.call("POST", f"/api/v1/tasks/{task_id}/tool-calls/", 201, json=body)

    def tool_result(self, key: str, *, lease_epoch: int, status: str = "succeeded",
                    result: dict[str, Any] | None = None) -> dict[str, Any]:
        body = {"status": status, "result": result or {}, "lease_epoch": lease_epoch}
        return self.call("POST", f"/api/v1/tool-calls/{key}/result/", 201, json=body)

    def subtask(self, task_id: str, *, step: int, kind: str, lease_epoch: int,
                input: dict[str, Any] | None = None) -> dict[str, Any]:
        body = {"step": step, "kind": kind, "input": input or {}, "lease_epoch": lease_epoch}
        return self.call("POST", f"/api/v1/tasks/{task_id}/subtasks/", 201, json=body)


@pytest.fixture
def make_agent(committed_db: None, web_server: WebProcess) -> Iterator[Callable[..., ApiAgent]]:
    """``make_agent(name=..., namespace=..., kinds=(...), server=web_server)``: a registered agent
    (``services.agent_create``, as ``manage.py create_agent`` does) and its HTTP client."""
    made: list[ApiAgent] = []

    def make(name: str | None = None, namespace: str = "acme", kinds: tuple[str, ...] = (),
             server: WebProcess | None = None) -> ApiAgent:
        name = name or f"agent-{uuid.uuid4().hex[:8]}"
        created = services.agent_create(name=name, namespace=namespace, kinds=kinds)
        agent = ApiAgent(name=name, namespace=namespace, token=created.token, server=server or web_server)
        made.append(agent)
        return agent

    yield make
    for agent in made:
        agent.close()

