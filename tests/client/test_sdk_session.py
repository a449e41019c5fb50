"""TaskSession against the live server: heartbeats, lost leases, resumable tool calls and
sub-agents, completing and failing. A "crash" is a session left without finishing; the stall
detector's sweep (run here with a clock past the lease) takes the task back, and another
agent claims it, as in production after a lease runs out."""

from __future__ import annotations

import threading
import time
from collections import Counter
from typing import Any

import pytest
from django.db import connection

from backplane_client import AgentClient, LeaseLost, ToolCallFailed
from backplane_client.errors import ToolOutcomeMissing
from recovery.detector import lease_expire_stalled
from recovery.models import Tool
from tests.client.conftest import QUICK, Agents, Crash, FaultProxy, Fleet
from tests.e2e.conftest import ToolServer
from tests.support.waiting import wait_until

# --- the lease -----------------------------------------------------------------------------


@pytest.mark.slow
def test_the_heartbeat_keeps_a_short_lease_alive_past_its_length(agents: Agents) -> None:
    task_id = agents.task()
    with agents.claim(agents.worker, lease_seconds=2) as session:
        assert session.heartbeat_interval == pytest.approx(2 / 3)
        time.sleep(3.0)
        # Without heartbeats the lease would have run out a second ago and this write be refused.
        session.append("LeadScored", {"score": 5})
        assert session.heartbeats >= 2 and not session.lost
        assert lease_expire_stalled().expired == 0
    assert agents.planner.get_task(task_id)["status"] == "running"


def test_a_lost_lease_stops_the_heartbeat_and_writes_are_refused_unsent(
    agents: Agents, fleet: Fleet, fault_proxy: FaultProxy
) -> None:
    task_id = agents.task()
    with AgentClient(fault_proxy.url, fleet.tokens["worker"], retry=QUICK) as worker, \
            agents.claim(worker, heartbeat_interval=0.2) as session:
        wait_until(lambda: session.heartbeats >= 1, timeout=5, what="a first heartbeat", interval=0.02)
        agents.expire()
        wait_until(lambda: session.lost, timeout=5, what="the heartbeat finds the lease lost", interval=0.02)
        assert isinstance(session.lost_error, LeaseLost) and session.lost_error.code == "stale_lease"

        seq, beats = agents.last_seq(task_id), len(fault_proxy.requests_to("/heartbeat/"))
        with pytest.raises(LeaseLost) as refused:
            session.append("LeadScored", {"score": 5})
        assert refused.value.sent is False
        with pytest.raises(LeaseLost):
            session.complete({"too": "late"})
        time.sleep(0.5)  # two and a half heartbeat intervals
        assert fault_proxy.requests_to("/events/") == [], "a write reached the server"
        assert len(fault_proxy.requests_to("/heartbeat/")) == beats, "the heartbeat went on"
        assert agents.last_seq(task_id) == seq


def test_a_write_refused_as_stale_marks_the_session_lost(agents: Agents) -> None:
    task_id = agents.task()
    with agents.claim(agents.worker, heartbeat_interval=600) as session:
        agents.expire()
        assert not session.lost  # the heartbeat has not noticed yet
        with pytest.raises(LeaseLost) as stale:
            session.reason(1, {"decision": "call"})
        assert (stale.value.sent, stale.value.code, session.lost) == (True, "stale_lease", True)
        seq = agents.last_seq(task_id)
        with pytest.raises(LeaseLost) as unsent:
            session.reason(2, {"decision": "call"})
        assert unsent.value.sent is False and agents.last_seq(task_id) == seq


def test_release_hands_the_task_back_uncounted_and_ends_the_session(agents: Agents) -> None:
    task_id = agents.task()
    with agents.claim(agents.worker) as session:
        task = session.release()
        assert (task["status"], task["attempts"]) == ("pending", 0)
        with pytest.raises(LeaseLost) as ended:
            session.append("LeadScored", {"score": 1})
        assert ended.value.sent is False and not session.lost
    again = agents.claim(agents.other)
    assert again.task_id == task_id and again.recovered is False


# --- steps and tool calls across a crash -------------------------------------------------------


def test_reason_logs_a_step_once_across_attempts(agents: Agents) -> None:
    task_id = agents.task()
    with agents.claim(agents.worker) as first:
        event = first.reason(1, {"decision": "call the tool"})
        assert event is not None and event["idempotency_key"] == f"{task_id}:reasoning:1"
        assert first.reason(1, {"decision": "something else"}) is None
    agents.expire()

    with agents.claim(agents.other) as second:
        assert second.recovered and second.attempt == 2
        seq = agents.last_seq(task_id)
        # The model says something else this time; the log keeps the first answer, unsent.
        assert second.reason(1, {"decision": "call another tool"}) is None
        assert second.step_done(1) and not second.step_done(2)
        assert agents.last_seq(task_id) == seq
        second.reason(2, {"decision": "done"})
    assert agents.types(task_id)["ReasoningStepCompleted"] == 2


def test_resume_decides_a_step_once_and_gives_later_attempts_the_first_decision(agents: Agents) -> None:
    task_id = agents.task()
    decisions = iter([{"route": "email"}, {"route": "phone"}])
    with agents.claim(agents.worker) as first:
        assert first.resume(1, lambda: next(decisions)) == {"route": "email", "step": 1}
        assert first.resume(1, lambda: next(decisions)) == {"route": "email", "step": 1}
    agents.expire()

    with agents.claim(agents.other) as second:
        seq = agents.last_seq(task_id)
        # The model would say "phone" now; the log's "email" is what the task goes on with.
        assert second.resume(1, lambda: next(decisions)) == {"route": "email", "step": 1}
        assert agents.last_seq(task_id) == seq
        assert "Completed reasoning steps: 1." in second.resume_prompt
    assert next(decisions) == {"route": "phone"}
    assert agents.types(task_id)["ReasoningStepCompleted"] == 1


def test_a_tool_call_answered_before_the_crash_is_not_made_again(agents: Agents) -> None:
    task_id = agents.task()
    effects: Counter[str] = Counter()

    def send_email(key: str, body: dict[str, Any]) -> dict[str, Any]:
        effects[key] += 1
        return {"sent_to": body["to"], "message_id": f"m-{effects.total()}"}

    with agents.claim(agents.worker) as first:
        call = first.call_tool(2, "send-email", {"to": "alice@example.com"}, send_email)
        assert (call.needed, call.replayed, call.status) == (True, False, "succeeded")
        assert call.result == {"sent_to": "alice@example.com", "message_id": "m-1"}
    agents.expire()  # died before completing

    with agents.claim(agents.other) as second:
        assert second.tool_result(2, "send-email") == {"status": "succeeded", "result": call.result,
                                                        "idempotency_key": call.key}
        with second.tool_call(2, "send-email", {"to": "alice@example.com"}) as again:
            assert (again.needed, again.replayed, again.key) == (False, True, call.key)
            assert (again.status, again.result) == ("succeeded", call.result)
        again_fn = second.call_tool(2, "send-email", {"to": "alice@example.com"}, send_email)
        assert again_fn.result == call.result
        second.complete({"email": again.result})
    assert effects == Counter({call.key: 1})
    types = agents.types(task_id)
    assert (types["ToolCallDispatched"], types["ToolCallResultReceived"], types["TaskCompleted"]) == (1, 1, 1)


def test_a_call_in_flight_at_the_crash_is_made_again_with_the_same_key(agents: Agents) -> None:
    task_id = agents.task()
    with agents.claim(agents.worker) as first:
        with pytest.raises(Crash), first.tool_call(2, "send-email", {"to": "bob@example.com"}) as call:
            assert call.needed and call.status == "dispatched"
            raise Crash("died with the request on the wire")
        assert first.tool_result(2, "send-email") is None
        assert agents.planner.get_tool_call(call.key)["status"] == "in_flight"
    agents.expire()

    with agents.claim(agents.other) as second:
        assert [c["idempotency_key"] for c in second.context()["in_flight_tool_calls"]] == [call.key]
        with second.tool_call(2, "send-email", {"to": "bob@example.com"}) as again:
            assert (again.needed, again.status, again.replayed, again.key) == (True, "in_flight", True, call.key)
            again.result = {"sent_to": "bob@example.com"}  # a result alone records a success
        assert (again.status, again.result) == ("succeeded", {"sent_to": "bob@example.com"})
    record = agents.planner.get_tool_call(call.key)
    assert (record["status"], record["result"]) == ("succeeded", {"sent_to": "bob@example.com"})
    assert agents.types(task_id)["ToolCallResultReceived"] == 1


def test_a_refusal_is_recorded_as_failed_and_other_errors_record_nothing(agents: Agents) -> None:
    agents.task()

    def bounce(key: str, body: dict[str, Any]) -> dict[str, Any]:
        raise ToolCallFailed({"error": "mailbox does not exist"})

    def time_out(key: str, body: dict[str, Any]) -> dict[str, Any]:
        raise TimeoutError("the tool did not answer")

    with agents.claim(agents.worker) as session:
        failed = session.call_tool(2, "send-email", {"to": "nobody@example.com"}, bounce)
        assert (failed.status, failed.result) == ("failed", {"error": "mailbox does not exist"})
        assert agents.planner.get_tool_call(failed.key)["status"] == "failed"
        assert session.tool_result(2, "send-email") == {"status": "failed", "result": failed.result,
                                                         "idempotency_key": failed.key}

        with pytest.raises(TimeoutError):
            session.call_tool(3, "send-email", {"to": "slow@example.com"}, time_out)
        with pytest.raises(ToolOutcomeMissing), session.tool_call(4, "send-email", {"to": "x@example.com"}):
            pass  # needed, but the block forgot to say how it went
        in_flight = {c["step"] for c in session.refresh_context()["in_flight_tool_calls"]}
        assert in_flight == {3, 4}
        assert session.tool_result(3, "send-email") is None


def test_invoke_has_the_gateway_call_the_tool_once(agents: Agents, fleet: Fleet, tool_server: ToolServer) -> None:
    Tool.objects.create(name="lookup", namespace=fleet.namespace, url=tool_server.url("lookup"), timeout_seconds=5)
    agents.task()
    with agents.claim(agents.worker) as session:
        first = session.invoke(2, "lookup", {"company": "Example Ltd"})
        again = session.invoke(2, "lookup", {"company": "Example Ltd"})
        assert (first["status"], first["replayed"], again["replayed"]) == ("succeeded", False, True)
        assert first["result"] == again["result"] and first["result"]["input"] == {"company": "Example Ltd"}
        assert session.tool_result(2, "lookup") == {"status": "succeeded", "result": first["result"],
                                                     "idempotency_key": first["idempotency_key"]}
    assert tool_server.effects == Counter({first["idempotency_key"]: 1})


# --- sub-agents ----------------------------------------------------------------------------------


def test_a_subtask_is_dispatched_once_and_its_result_awaited(agents: Agents) -> None:
    task_id = agents.task()
    done = threading.Event()

    def research() -> None:
        session = agents.child.claim_session([Fleet.CHILD_KIND], lease_seconds=10)
        assert session is not None
        with session:
            session.complete({"employees": 120, "asked": session.input["company"]})
        done.set()

    with agents.claim(agents.worker, heartbeat_interval=0.3) as parent:
        child = parent.subtask(3, Fleet.CHILD_KIND, {"company": "Example Ltd"})
        assert child["parent_task_id"] == task_id and child["status"] == "pending"
        assert parent.subtask(3, Fleet.CHILD_KIND, {"company": "Example Ltd"})["task_id"] == child["task_id"]
        entry = parent.subtask_of(3, Fleet.CHILD_KIND)
        assert entry is not None and entry["status"] == "dispatched"
        worker = threading.Thread(target=research)
        worker.start()
        result = parent.wait_for_subtask(child["task_id"], timeout=20)
        worker.join(timeout=10)
        assert done.is_set()
        assert (result["child_task_id"], result["kind"], result["step"]) == (child["task_id"], Fleet.CHILD_KIND, 3)
        assert (result["status"], result["output"]) == ("completed", {"employees": 120, "asked": "Example Ltd"})

        unclaimed = parent.subtask(4, Fleet.CHILD_KIND, {"company": "Nobody Ltd"})
        started = time.monotonic()
        with pytest.raises(TimeoutError):
            parent.wait_for_subtask(unclaimed["task_id"], timeout=0.5, poll=0.1)
        assert 0.5 <= time.monotonic() - started < 3
        parent.complete({"employees": result["output"]["employees"]})
    types = agents.types(task_id)
    assert (types["SubAgentDispatched"], types["SubAgentResultReceived"]) == (2, 1)


def test_waiting_for_a_subtask_ends_when_the_lease_is_lost(agents: Agents) -> None:
    agents.task()
    with agents.claim(agents.worker, heartbeat_interval=0.2) as parent:
        child = parent.subtask(3, Fleet.CHILD_KIND, {"company": "Example Ltd"})
        threading.Timer(0.3, expire_in_thread, args=(agents,)).start()
        started = time.monotonic()
        with pytest.raises(LeaseLost):
            parent.wait_for_subtask(child["task_id"], timeout=20)
        assert time.monotonic() - started < 5


def expire_in_thread(agents: Agents) -> None:
    try:
        agents.expire()
    finally:
        connection.close()  # this thread's own; the test database must have none left at the end


# --- the end -------------------------------------------------------------------------------------


def test_complete_writes_the_last_step_and_the_output_in_one_batch(agents: Agents) -> None:
    task_id = agents.task()
    with agents.claim(agents.worker) as session:
        session.reason(1, {"decision": "score it"})
        event = session.complete({"score": 9}, reasoning={"step": 2, "summary": "scored"})
        assert (event["type"], event["idempotency_key"]) == ("TaskCompleted", f"{task_id}:completed")
        with pytest.raises(LeaseLost) as ended:
            session.reason(3, {"decision": "one more"})
        assert ended.value.sent is False
    task = agents.planner.get_task(task_id)
    assert (task["status"], task["output"], task["lease"]) == ("completed", {"score": 9}, None)
    events = list(agents.planner.iter_events(task_id))
    assert [e["type"] for e in events[-2:]] == ["ReasoningStepCompleted", "TaskCompleted"]
    assert events[-2]["payload"] == {"step": 2, "summary": "scored"}
    assert agents.types(task_id)["ReasoningStepCompleted"] == 2


def test_complete_skips_a_final_step_already_logged(agents: Agents) -> None:
    task_id = agents.task()
    with agents.claim(agents.worker) as first:
        first.reason(2, {"summary": "scored"})
    agents.expire()
    with agents.claim(agents.other) as second:
        second.complete({"score": 9}, reasoning={"step": 2, "summary": "worded differently"})
    assert agents.types(task_id)["ReasoningStepCompleted"] == 1
    assert agents.planner.get_task(task_id)["status"] == "completed"


def test_fail_keys_each_attempt_and_retryable_requeues(agents: Agents) -> None:
    task_id = agents.task()
    with agents.claim(agents.worker) as first:
        event = first.fail("the model timed out", retryable=True)
        assert event["idempotency_key"] == f"{task_id}:failed:1"
    task = agents.planner.get_task(task_id)
    assert (task["status"], task["attempts"]) == ("pending", 1)

    with agents.claim(agents.other) as second:
        assert second.recovered and second.attempt == 2
        event = second.fail("the lead is invalid", retryable=False)
        assert event["idempotency_key"] == f"{task_id}:failed:2"
    task = agents.planner.get_task(task_id)
    assert (task["status"], task["error"]) == ("failed", "the lead is invalid")
    with pytest.raises(LeaseLost):
        second.append("LeadScored", {"score": 0})
