"""The Python client and personal data (docs/privacy.md), against the product's web process:
``personal()`` marks a value, the answers carry its envelope, ``personal_open`` gives it back,
``personal_lookup`` finds its subject; after the erasure both say so."""

from __future__ import annotations

from backplane.privacy.services import subject_erase
from backplane_client import personal
from tests.client.conftest import Agents

EMAIL = "ada@example.com"


def test_a_marked_value_goes_in_sealed_and_comes_back_opened(agents: Agents) -> None:
    bp = agents.planner
    task = bp.create_task("lead-qualification", {"lead": personal("lead:8812", EMAIL, lookup=True)})
    sealed = task["input"]["lead"]
    assert set(sealed["$personal"]) == {"subject", "sealed"} and EMAIL not in str(task)
    assert bp.personal_open(task["input"], task_id=task["task_id"]) == {"lead": EMAIL}
    assert bp.personal_lookup(EMAIL) == ["lead:8812"]

    subject_erase(namespace=agents.fleet.namespace, subject="lead:8812", reason="asked", erased_by="user:priya")
    erased = bp.personal_open(task["input"])["lead"]["$personal"]
    assert erased["subject"] == "lead:8812" and erased["erased_at"]
    assert bp.personal_lookup(EMAIL) == []
