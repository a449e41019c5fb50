"""Sandboxes never answer real tasks: the answers a sandbox's fork request made up
(``tool_answers``) are that sandbox's alone. A real fork's in-flight call inherited from the same
source stays in flight under the source's key, so the tool is asked (with that key) whether it
acted: it is never told by a sandbox's invention that it did."""

from __future__ import annotations

from typing import Any

from recovery.models import ToolCall
from tests.api.conftest import AgentClient, claim
from tests.api.test_forks_api import dispatch, fork, worked  # noqa: F401 - the fixture

__all__ = ["worked"]


def test_a_real_forks_in_flight_call_is_not_answered_from_a_sandboxs_edit(
    alice: AgentClient, worked: dict[str, Any]  # noqa: F811
) -> None:
    made_up = [{"step": 3, "tool": "email-send", "status": "succeeded", "result": {"message_id": "made-up"}}]
    sandbox = fork(alice, worked["task_id"], at_seq=1, sandbox=True, tool_answers=made_up).json()
    epoch = claim(alice, task_id=sandbox["task_id"])["lease_epoch"]
    replayed = dispatch(alice, sandbox["task_id"], 3, "email-send", {"to": "bob"}, lease_epoch=epoch).json()
    assert replayed["status"] == "succeeded" and replayed["result"] == {"message_id": "made-up"}
    # The sandbox's record carries the effect's key (it replays the source's call)...
    assert ToolCall.objects.get(task_id=sandbox["task_id"], step=3).effect_key == worked["mail"]

    # ...yet the real fork, whose history holds the same unanswered dispatch, is still in flight.
    real = fork(alice, worked["task_id"], at_seq=5).json()
    mail = dispatch(alice, real["task_id"], 3, "email-send", {"to": "bob"})
    assert mail.status_code == 200, mail.content
    assert mail.json()["status"] == "in_flight" and mail.json()["effect_key"] == worked["mail"]
    assert "result" not in mail.json()


def test_a_sandbox_does_not_see_another_sandboxs_edit(alice: AgentClient, worked: dict[str, Any]) -> None:  # noqa: F811
    made_up = [{"step": 3, "tool": "email-send", "status": "succeeded", "result": {"message_id": "made-up"}}]
    first = fork(alice, worked["task_id"], at_seq=1, sandbox=True, tool_answers=made_up).json()
    epoch = claim(alice, task_id=first["task_id"])["lease_epoch"]
    assert dispatch(alice, first["task_id"], 3, "email-send", {"to": "bob"}, lease_epoch=epoch).status_code == 200
    # A second sandbox of the same source, without edits: the record has no answer for the mail.
    second = fork(alice, worked["task_id"], at_seq=1, sandbox=True).json()
    epoch = claim(alice, task_id=second["task_id"])["lease_epoch"]
    refused = dispatch(alice, second["task_id"], 3, "email-send", {"to": "bob"}, lease_epoch=epoch)
    assert refused.status_code == 409 and refused.json()["error"]["code"] == "sandbox_refused"
