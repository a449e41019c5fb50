"""Logins are throttled per username and address (django-axes, backplane/settings.py): after
BACKPLANE_LOGIN_FAILURE_LIMIT failures the next login is refused, the right password included,
until the cool-off has passed. Real POSTs to the dashboard's and the admin's login pages."""

from __future__ import annotations

from datetime import timedelta

import pytest
from axes.models import AccessAttempt
from django.conf import settings
from django.contrib.auth.models import User
from django.test import Client

from tests.support.roles import staff_user

PASSWORD = "correct horse battery"


@pytest.fixture
def olivia(db: None) -> User:
    return staff_user("olivia", "Operators", password=PASSWORD)


def log_in(client: Client, path: str, password: str, username: str = "olivia") -> int:
    return client.post(path, {"username": username, "password": password}).status_code


@pytest.mark.parametrize("path", ["/login/", "/admin/login/"])
def test_it_refuses_the_right_password_after_the_limit_of_failures(olivia: User, path: str) -> None:
    client = Client()
    for _ in range(settings.AXES_FAILURE_LIMIT - 1):
        assert log_in(client, path, "wrong") == 200  # the form again, with its error
    assert log_in(client, path, "wrong") == 429
    assert log_in(client, path, PASSWORD) == 429
    assert "_auth_user_id" not in client.session


def test_it_counts_per_username(olivia: User) -> None:
    staff_user("rita", "Reviewers", password=PASSWORD)
    client = Client()
    for _ in range(settings.AXES_FAILURE_LIMIT):
        log_in(client, "/login/", "wrong")
    assert log_in(client, "/login/", PASSWORD, username="rita") == 302


def test_it_lets_the_right_password_in_after_the_cool_off(olivia: User) -> None:
    client = Client()
    for _ in range(settings.AXES_FAILURE_LIMIT):
        log_in(client, "/login/", "wrong")
    assert log_in(client, "/login/", PASSWORD) == 429
    # The cool-off runs from the last failure: move it back past the period.
    AccessAttempt.objects.update(attempt_time=AccessAttempt.objects.get().attempt_time
                                 - settings.AXES_COOLOFF_TIME - timedelta(seconds=1))
    assert log_in(client, "/login/", PASSWORD) == 302
    assert client.session["_auth_user_id"] == str(olivia.pk)
