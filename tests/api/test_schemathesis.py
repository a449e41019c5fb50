"""Property-based run of the whole API against its own OpenAPI schema (Schemathesis).

Every generated request goes through the real Django stack and PostgreSQL with a valid
agent token; the checks fail on any 5xx and on any response the schema does not allow
(status code, content type, headers, body).
"""

from __future__ import annotations

import hashlib
import os
from typing import TYPE_CHECKING, Any

import pytest
import schemathesis
from django.core.cache import cache
from django.core.signals import request_finished, request_started
from django.db import close_old_connections, transaction
from hypothesis import HealthCheck, settings
from schemathesis.checks import positive_data_acceptance

from backplane.eventlog import services
from backplane.wsgi import application

schema = schemathesis.openapi.from_wsgi("/api/schema/?format=json", application)


@pytest.fixture(autouse=True)
def keep_the_test_connection():  # type: ignore[no-untyped-def]
    """The real WSGI app closes the database connection at the end of each request, which
    would end the test's transaction; Django's test client turns that off the same way."""
    request_started.disconnect(close_old_connections)
    request_finished.disconnect(close_old_connections)
    yield
    request_started.connect(close_old_connections)
    request_finished.connect(close_old_connections)


@pytest.fixture
def agent_with_tasks(db):  # type: ignore[no-untyped-def]
    created = services.agent_create(name="fuzzer", namespace="fuzz")
    task = services.task_create(namespace="fuzz", kind="fuzz", input={}, agent="fuzzer").task
    return created.token, str(task.pk)


@schema.parametrize()
# Derandomized in the suite so CI is repeatable; `make fuzz` runs it with fresh randomness.
@settings(
    max_examples=int(os.environ.get("BACKPLANE_FUZZ_EXAMPLES", "30")),
    derandomize=os.environ.get("BACKPLANE_FUZZ_RANDOM") != "1",
    deadline=None,
    suppress_health_check=list(HealthCheck),
)
def test_the_api_keeps_to_its_schema(case, agent_with_tasks, keep_the_test_connection) -> None:  # type: ignore[no-untyped-def]
    token, task_id = agent_with_tasks
    cache.clear()  # the per-token rate limit is not what this run is about
    # Half of the generated task ids are swapped for a real task, so requests get past
    # the 404 and exercise validation, fencing and writes too.
    positive = case.meta is None or not case.meta.generation.mode.is_negative
    if positive and "task_id" in (case.path_parameters or {}):
        digest = hashlib.sha256(repr(case.body).encode()).digest()
        if digest[0] % 2 == 0:
            case.path_parameters["task_id"] = task_id
    # Excluded: "schema-valid data must be accepted". Some rules of the contract cannot be
    # written in OpenAPI 3.0 (reserved event types, a ReasoningStepCompleted needs an
    # integer payload.step, U+0000 in strings), so such requests rightly get 400.
    case.call_and_validate(
        headers={"Authorization": f"Bearer {token}"},
        excluded_checks=[positive_data_acceptance],
    )


# --- stateful: sequences that follow the schema's links (create -> get, append, claim, ...) ------

stateful_schema = schemathesis.openapi.from_wsgi("/api/schema/?format=json", application)
stateful_token = {"value": ""}


@stateful_schema.auth(refresh_interval=None)
class AgentToken:
    """The agent's token as the schema's own auth, so Schemathesis's auth checks take it as the
    real credentials (and probe that the API refuses the request without them)."""

    def get(self, case: schemathesis.Case, context: schemathesis.AuthContext) -> str:
        return stateful_token["value"]

    def set(self, case: schemathesis.Case, data: str, context: schemathesis.AuthContext) -> None:
        case.headers["Authorization"] = f"Bearer {data}"


if TYPE_CHECKING:
    from schemathesis.generation.stateful.state_machine import RecordingStateMachine as Workflow
else:
    Workflow = stateful_schema.as_state_machine()


class AgentWorkflow(Workflow):
    """The same checks as the stateless run, plus Schemathesis's stateful ones."""

    def setup(self) -> None:
        # Each scenario starts from the same database: the links a step can follow depend on
        # earlier answers, and Hypothesis refuses a run whose replays take other transitions.
        # Marked like the test case's own atomic blocks, so the services' durable ones may nest.
        self.scenario = transaction.atomic()
        vars(self.scenario)["_from_testcase"] = True
        self.scenario.__enter__()

    def teardown(self) -> None:
        transaction.set_rollback(True)
        self.scenario.__exit__(None, None, None)

    def before_call(self, case: schemathesis.Case) -> None:
        cache.clear()  # the per-token rate limit is not what this run is about

    def validate_response(
        self,
        response: schemathesis.Response,
        case: schemathesis.Case,
        additional_checks: list[schemathesis.CheckFunction] | None = None,
        **kwargs: Any,
    ) -> None:
        case.validate_response(response, additional_checks=additional_checks,
                               excluded_checks=[positive_data_acceptance], transport_kwargs=kwargs or None,
                               recorder=self.recorder)


def test_sequences_that_follow_the_links_keep_to_the_schema(
    agent_with_tasks: tuple[str, str], keep_the_test_connection: None
) -> None:
    stateful_token["value"] = agent_with_tasks[0]
    AgentWorkflow.run(settings=settings(
        max_examples=int(os.environ.get("BACKPLANE_FUZZ_STATEFUL_EXAMPLES", "30")),
        stateful_step_count=6,
        derandomize=os.environ.get("BACKPLANE_FUZZ_RANDOM") != "1",
        deadline=None,
        suppress_health_check=list(HealthCheck),
    ))
