"""The SDK's retries against the live server: lost answers, 503s, refused connections, 429s.

A lost answer is made by a proxy that forwards the request, lets the server answer, and closes
the connection instead of relaying it (tests/client/conftest.py): the write happened, the
client saw a transport error, and its retry must land on the original write.
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Iterator

import httpx
import pytest

from backplane_client import AgentClient, BackplaneAPIError, RetryPolicy, event_draft
from tests.client.conftest import DROP_ANSWER, UNAVAILABLE, CountingTransport, FaultProxy, Fleet
from tests.support.live_server import WebProcess, free_port

# Fast retries for the tests: the waits are not what is tested here (except Retry-After's).
QUICK = RetryPolicy(attempts=3, base_delay=0.01, max_delay=0.05)


def client(url: str, token: str, retry: RetryPolicy = QUICK) -> AgentClient:
    return AgentClient(url, token, retry=retry)


def event_types(observer: AgentClient, task_id: str) -> list[str]:
    return [event["type"] for event in observer.iter_events(task_id)]


# --- the policy on its own -------------------------------------------------------------------


def answer(status: int, retry_after: str | None = None) -> httpx.Response:
    headers = {"Retry-After": retry_after} if retry_after is not None else {}
    return httpx.Response(status, headers=headers, request=httpx.Request("GET", "http://backplane/"))


def test_the_backoff_is_exponential_capped_and_fully_jittered() -> None:
    exact = RetryPolicy(base_delay=0.2, max_delay=1.0, jitter=False)
    assert [exact.backoff(n) for n in range(1, 6)] == [0.2, 0.4, 0.8, 1.0, 1.0]
    jittered = RetryPolicy(base_delay=0.2, max_delay=1.0)
    waits = [jittered.backoff(3) for _ in range(200)]
    assert all(0.0 <= wait <= 0.8 for wait in waits)
    assert len(set(waits)) > 150 and min(waits) < 0.2 and max(waits) > 0.6


def test_it_retries_429_and_503_only_and_honours_retry_after() -> None:
    policy = RetryPolicy(attempts=3, base_delay=0.1, max_delay=2.0, jitter=False)
    assert policy.delay_after_answer(1, answer(503)) == 0.1
    assert policy.delay_after_answer(2, answer(429)) == 0.2
    # Up to 60 s the header is waited out in full, past max_delay; beyond that it is capped.
    assert policy.delay_after_answer(1, answer(429, "30")) == 30.0
    assert policy.delay_after_answer(1, answer(503, "120")) == 2.0
    jittered = RetryPolicy(base_delay=0.1).delay_after_answer(1, answer(429, "1"))
    assert jittered is not None and 1.0 <= jittered <= 1.1  # jitter only ever adds
    for final in (200, 201, 400, 404, 409, 422, 500, 502):
        assert policy.delay_after_answer(1, answer(final)) is None, final
    assert policy.delay_after_answer(3, answer(503)) is None  # the last attempt
    assert RetryPolicy.none().delay_after_answer(1, answer(503)) is None


def test_it_retries_transport_errors_but_not_requests_that_cannot_be_formed() -> None:
    policy = RetryPolicy(attempts=2, base_delay=0.1, jitter=False)
    request = httpx.Request("GET", "http://backplane/")
    for error in (httpx.ConnectError("refused", request=request), httpx.ReadTimeout("slow", request=request),
                  httpx.RemoteProtocolError("closed", request=request)):
        assert policy.delay_after_error(1, error) == 0.1
        assert policy.delay_after_error(2, error) is None
    assert policy.delay_after_error(1, httpx.UnsupportedProtocol("ftp://", request=request)) is None
    with pytest.raises(ValueError):
        RetryPolicy(attempts=0)


# --- lost answers: retried into replays ------------------------------------------------------


def test_a_lost_answer_to_an_append_is_retried_into_a_replay(
    sdk_server: WebProcess, fleet: Fleet, fault_proxy: FaultProxy
) -> None:
    with client(sdk_server.url, fleet.tokens["planner"]) as observer, \
            client(fault_proxy.url, fleet.tokens["planner"]) as bp:
        task_id = observer.create_task(Fleet.KIND, {"lead": "alice"})["task_id"]
        fault_proxy.fail_next(DROP_ANSWER)
        event = bp.append(task_id, "LeadScored", {"score": 7})
        # Asserted through a name: on ``bp.last_replayed`` itself, mypy would keep the property
        # narrowed to True past the next append.
        replayed = bp.last_replayed
        assert replayed, "the retry's answer is the original event, replayed"

        assert [what for _, _, what in fault_proxy.requests_to("/events/")] == [DROP_ANSWER, "forward"]
        assert event_types(observer, task_id) == ["TaskStarted", "LeadScored"]
        [stored] = [e for e in observer.iter_events(task_id) if e["type"] == "LeadScored"]
        assert stored["seq"] == event["seq"] and stored["idempotency_key"] == event["idempotency_key"]
        assert len(event["idempotency_key"]) == 32  # generated: uuid4 hex

        # A new call is a new write: the key is per call, not per client.
        bp.append(task_id, "LeadScored", {"score": 7})
        assert not bp.last_replayed
        assert event_types(observer, task_id).count("LeadScored") == 2


def test_a_lost_answer_to_a_batch_is_retried_into_a_replay(
    sdk_server: WebProcess, fleet: Fleet, fault_proxy: FaultProxy
) -> None:
    with client(sdk_server.url, fleet.tokens["planner"]) as observer, \
            client(fault_proxy.url, fleet.tokens["planner"]) as bp:
        task_id = observer.create_task(Fleet.KIND, {"lead": "bob"})["task_id"]
        fault_proxy.fail_next(DROP_ANSWER)
        written = bp.append_batch(task_id, [event_draft("LeadScored", {"score": 1}),
                                            event_draft("LeadRouted", {"to": "sales"}, idempotency_key="route-1")])
        assert bp.last_replayed
        assert [e["seq"] for e in written] == [2, 3]
        assert written[1]["idempotency_key"] == "route-1"
        assert event_types(observer, task_id) == ["TaskStarted", "LeadScored", "LeadRouted"]


def test_a_lost_answer_to_create_task_returns_the_same_task(
    sdk_server: WebProcess, fleet: Fleet, fault_proxy: FaultProxy
) -> None:
    with client(sdk_server.url, fleet.tokens["planner"]) as observer, \
            client(fault_proxy.url, fleet.tokens["planner"]) as bp:
        fault_proxy.fail_next(DROP_ANSWER)
        task = bp.create_task(Fleet.KIND, {"lead": "carol"})
        assert [what for _, _, what in fault_proxy.requests_to("/tasks/")] == [DROP_ANSWER, "forward"]
        listed = observer.list_tasks(kind=Fleet.KIND)["results"]
        assert [t["task_id"] for t in listed] == [task["task_id"]]
        assert event_types(observer, task["task_id"]) == ["TaskStarted"]


# --- 503 and refused connections ----------------------------------------------------------------


def test_a_503_is_retried_until_an_answer_comes(
    sdk_server: WebProcess, fleet: Fleet, fault_proxy: FaultProxy
) -> None:
    with client(fault_proxy.url, fleet.tokens["planner"]) as bp:
        fault_proxy.fail_next(UNAVAILABLE, UNAVAILABLE)
        task = bp.create_task(Fleet.KIND, {"lead": "dan"})
        assert [what for _, _, what in fault_proxy.requests_to("/tasks/")] == [UNAVAILABLE, UNAVAILABLE, "forward"]
        assert bp.get_task(task["task_id"])["status"] == "pending"


def test_a_503_on_every_attempt_reaches_the_caller_and_writes_nothing(
    sdk_server: WebProcess, fleet: Fleet, fault_proxy: FaultProxy
) -> None:
    with client(sdk_server.url, fleet.tokens["planner"]) as observer, \
            client(fault_proxy.url, fleet.tokens["planner"]) as bp:
        task_id = observer.create_task(Fleet.KIND, {"lead": "erin"})["task_id"]
        fault_proxy.fail_next(*[UNAVAILABLE] * QUICK.attempts)
        with pytest.raises(BackplaneAPIError) as refused:
            bp.append(task_id, "LeadScored", {"score": 3})
        assert (refused.value.status, refused.value.code, refused.value.attempts) == (503, "unavailable", 3)
        assert len(fault_proxy.requests_to("/events/")) == QUICK.attempts
        assert event_types(observer, task_id) == ["TaskStarted"]


@pytest.mark.parametrize("attempts", [1, 4])
def test_a_port_with_nothing_listening_raises_after_every_attempt(attempts: int) -> None:
    port = free_port()
    transport = CountingTransport()
    http = httpx.Client(base_url=f"http://127.0.0.1:{port}", transport=transport, timeout=2)
    policy = RetryPolicy(attempts=attempts, base_delay=0.01, max_delay=0.02)
    with AgentClient("http://unused", "token", retry=policy, http_client=http) as bp, \
            pytest.raises(httpx.ConnectError) as refused:
        bp.get_task(uuid.uuid4())
    http.close()
    assert transport.sent == attempts
    assert f"no answer after {attempts} attempt(s)" in "\n".join(refused.value.__notes__)


def test_other_errors_are_never_retried(sdk_server: WebProcess, fleet: Fleet, fault_proxy: FaultProxy) -> None:
    with client(sdk_server.url, fleet.tokens["planner"]) as observer, \
            client(fault_proxy.url, fleet.tokens["planner"]) as bp:
        task_id = observer.create_task(Fleet.KIND, {"lead": "fay"})["task_id"]
        with pytest.raises(BackplaneAPIError) as conflict:
            bp.append(task_id, "LeadScored", {"score": 3}, expected_seq=7)
        assert (conflict.value.status, conflict.value.code, conflict.value.attempts) == (409, "seq_conflict", 1)
        with pytest.raises(BackplaneAPIError) as missing:
            bp.get_task(uuid.uuid4())
        assert missing.value.status == 404
        assert [what for _, _, what in fault_proxy.seen] == ["forward", "forward"]


# --- 429 from the server's own rate limit ------------------------------------------------------


@pytest.fixture(scope="module")
def limited_server(django_db_setup: None) -> Iterator[WebProcess]:
    """A web process with a per-token limit of 4 requests a second (``BACKPLANE_RATE_LIMIT``)."""
    server = WebProcess(name="sdk-limited")
    with pytest.MonkeyPatch.context() as patch:
        patch.setitem(os.environ, "BACKPLANE_RATE_LIMIT", "4/s")
        server.start()
    try:
        yield server
    finally:
        server.close()


@pytest.mark.slow
def test_a_429_waits_retry_after_then_succeeds(limited_server: WebProcess, fleet: Fleet) -> None:
    sent: list[tuple[float, int | None]] = []  # (when, status) for each request, then its answer

    def on_request(request: httpx.Request) -> None:
        sent.append((time.monotonic(), None))

    def on_response(response: httpx.Response) -> None:
        sent.append((time.monotonic(), response.status_code))

    http = httpx.Client(base_url=limited_server.url, headers={"Authorization": f"Bearer {fleet.tokens['worker']}"},
                        event_hooks={"request": [on_request], "response": [on_response]})
    with AgentClient(limited_server.url, fleet.tokens["planner"]) as planner, \
            AgentClient(limited_server.url, "unused", http_client=http) as bp:
        task_id = planner.create_task(Fleet.KIND, {"lead": "gus"})["task_id"]
        for _ in range(10):
            assert bp.get_task(task_id)["task_id"] == task_id
    http.close()

    statuses = [status for _, status in sent if status is not None]
    assert statuses.count(200) == 10 and statuses.count(429) >= 1, statuses
    for index, (when, status) in enumerate(sent):
        if status == 429:
            next_request = sent[index + 1][0]
            assert next_request - when >= 1.0, "Retry-After: 1 was not waited out"


@pytest.mark.slow
def test_a_429_without_retries_reaches_the_caller(limited_server: WebProcess, fleet: Fleet) -> None:
    with AgentClient(limited_server.url, fleet.tokens["planner"]) as planner, \
            AgentClient(limited_server.url, fleet.tokens["worker"], retry=RetryPolicy.none()) as bp:
        task_id = planner.create_task(Fleet.KIND, {"lead": "hal"})["task_id"]
        with pytest.raises(BackplaneAPIError) as limited:
            for _ in range(10):
                bp.get_task(task_id)
    assert (limited.value.status, limited.value.code, limited.value.attempts) == (429, "rate_limited", 1)
    assert limited.value.retry_after is not None and limited.value.retry_after >= 1
