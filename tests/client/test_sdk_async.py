"""AsyncAgentClient against the live server: the same requests and retries as the sync client."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from backplane_client import AgentClient, AsyncAgentClient, BackplaneAPIError, LeaseLost, RetryPolicy, event_draft
from tests.client.conftest import DROP_ANSWER, UNAVAILABLE, FaultProxy, Fleet
from tests.support.live_server import WebProcess, free_port

QUICK = RetryPolicy(attempts=3, base_delay=0.01, max_delay=0.05)


def test_an_agent_creates_claims_works_and_completes_a_task(sdk_server: WebProcess, fleet: Fleet) -> None:
    async def work() -> str:
        async with AsyncAgentClient(sdk_server.url, fleet.tokens["planner"], retry=QUICK) as planner, \
                AsyncAgentClient(sdk_server.url, fleet.tokens["worker"], retry=QUICK) as worker:
            task = await planner.create_task(Fleet.KIND, {"lead": "alice"})
            lease = await worker.claim([Fleet.KIND], lease_seconds=30)
            assert lease is not None and lease.task_id == task["task_id"] and lease.lease_seconds == 30
            assert await worker.claim([Fleet.KIND]) is None
            epoch = lease.lease_epoch
            await worker.heartbeat(lease.task_id, epoch)
            await worker.append(lease.task_id, "ReasoningStepCompleted", {"step": 1}, lease_epoch=epoch,
                                idempotency_key="step-1")
            await worker.append(lease.task_id, "ReasoningStepCompleted", {"step": 1}, lease_epoch=epoch,
                                idempotency_key="step-1")
            assert worker.last_replayed
            context = await worker.recovery_context(lease.task_id)
            assert [s["step"] for s in context["completed_steps"]] == [1]
            dispatch = await worker.dispatch_tool_call(lease.task_id, 2, "send-email", {"to": "a@example.com"},
                                                       lease_epoch=epoch)
            await worker.record_tool_result(dispatch["idempotency_key"], "succeeded", {"ok": True},
                                            lease_epoch=epoch)
            assert (await worker.get_tool_call(dispatch["idempotency_key"]))["status"] == "succeeded"
            await worker.append_batch(lease.task_id, [event_draft("TaskCompleted", {"output": {"ok": True}})],
                                      lease_epoch=epoch)
            with pytest.raises(LeaseLost):
                await worker.heartbeat(lease.task_id, epoch)
            types = [event["type"] async for event in planner.iter_events(lease.task_id, page_size=2)]
            assert types == ["TaskStarted", "TaskClaimed", "ReasoningStepCompleted", "ToolCallDispatched",
                             "ToolCallResultReceived", "TaskCompleted"]
            assert (await planner.verify(lease.task_id))["valid"] is True
            return str(lease.task_id)

    task_id = asyncio.run(work())
    with AgentClient(sdk_server.url, fleet.tokens["planner"]) as observer:
        task = observer.get_task(task_id)
    assert (task["status"], task["output"]) == ("completed", {"ok": True})


def test_it_retries_lost_answers_into_replays_and_503s_into_answers(
    sdk_server: WebProcess, fleet: Fleet, fault_proxy: FaultProxy
) -> None:
    async def work() -> tuple[str, str]:
        async with AsyncAgentClient(fault_proxy.url, fleet.tokens["planner"], retry=QUICK) as bp:
            fault_proxy.fail_next(UNAVAILABLE, DROP_ANSWER)
            task = await bp.create_task(Fleet.KIND, {"lead": "bob"})
            fault_proxy.fail_next(DROP_ANSWER)
            event = await bp.append(task["task_id"], "LeadScored", {"score": 4})
            assert bp.last_replayed
            return task["task_id"], event["idempotency_key"]

    task_id, key = asyncio.run(work())
    assert [what for _, _, what in fault_proxy.requests_to("/tasks/")] == [
        UNAVAILABLE, DROP_ANSWER, "forward", DROP_ANSWER, "forward"]
    with AgentClient(sdk_server.url, fleet.tokens["planner"]) as observer:
        assert [t["task_id"] for t in observer.list_tasks(kind=Fleet.KIND)["results"]] == [task_id]
        events = list(observer.iter_events(task_id))
    assert [(e["type"], e["idempotency_key"]) for e in events[1:]] == [("LeadScored", key)]


class AsyncCountingTransport(httpx.AsyncHTTPTransport):
    """A real transport that counts the requests it was asked to send (connected or not)."""

    def __init__(self) -> None:
        super().__init__()
        self.sent = 0

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        self.sent += 1
        return await super().handle_async_request(request)


def test_errors_are_mapped_and_refused_connections_retried(sdk_server: WebProcess, fleet: Fleet) -> None:
    transport = AsyncCountingTransport()

    async def work() -> None:
        async with AsyncAgentClient(sdk_server.url, fleet.tokens["worker"], retry=QUICK) as bp:
            with pytest.raises(BackplaneAPIError) as missing:
                await bp.get_task("00000000-0000-0000-0000-000000000000")
            assert (missing.value.status, missing.value.code, missing.value.attempts) == (404, "not_found", 1)
        http = httpx.AsyncClient(base_url=f"http://127.0.0.1:{free_port()}", transport=transport)
        async with AsyncAgentClient("http://unused", "token", retry=QUICK, http_client=http) as refused:
            with pytest.raises(httpx.ConnectError) as error:
                await refused.list_tasks()
            assert f"no answer after {QUICK.attempts} attempt(s)" in "\n".join(error.value.__notes__)
        await http.aclose()

    asyncio.run(work())
    assert transport.sent == QUICK.attempts
