"""`manage.py create_agent` prints a token once and stores only its hash."""

from __future__ import annotations

import hashlib
import io

import pytest
from django.core.management import CommandError, call_command

from backplane.eventlog.models import Agent


def test_it_prints_a_token_and_stores_only_its_hash(db: None) -> None:
    out = io.StringIO()
    call_command("create_agent", "qualifier-1", "--namespace", "acme", "--kinds", "lead-qualification, scoring",
                 stdout=out, stderr=io.StringIO())
    token = out.getvalue().strip()
    agent = Agent.objects.get(name="qualifier-1")
    assert token.startswith("bp_") and len(token) > 40
    assert agent.token_hash == hashlib.sha256(token.encode()).hexdigest()
    assert token not in str(Agent.objects.values().get(pk=agent.pk))
    assert agent.kinds == ["lead-qualification", "scoring"] and agent.namespace == "acme"
    assert agent.token_matches(token) and not agent.token_matches(token + "x")


def test_it_refuses_a_duplicate_name_in_a_namespace(db: None) -> None:
    call_command("create_agent", "a1", "--namespace", "acme", stdout=io.StringIO(), stderr=io.StringIO())
    with pytest.raises(CommandError):
        call_command("create_agent", "a1", "--namespace", "acme", stdout=io.StringIO(), stderr=io.StringIO())
    call_command("create_agent", "a1", "--namespace", "globex", stdout=io.StringIO(), stderr=io.StringIO())
    assert Agent.objects.filter(name="a1").count() == 2


def test_it_refuses_a_bad_name(db: None) -> None:
    with pytest.raises(CommandError):
        call_command("create_agent", "has space", "--namespace", "acme", stdout=io.StringIO(), stderr=io.StringIO())
    assert not Agent.objects.exists()
