"""A dashboard-sized data set: tasks and agent-step events, loaded with COPY.

``load(url, tasks=..., events=...)`` writes ``tasks`` task rows and exactly ``events`` events
into a migrated database and returns a ``Dataset`` describing what it planted. Generation is
seeded, so two runs of the same size hold the same rows (only the clock moves).

What the rows look like:
- every task's log starts with ``TaskStarted`` (its ``input``) and ``TaskClaimed``, then repeats
  a step: ``ReasoningStepCompleted`` (a thought), ``ToolCallDispatched`` (a 64-hex idempotency
  key, a tool and its input), ``ToolCallResultReceived``; now and then a ``TaskStalled`` and a
  new claim; it ends as its status says (``TaskCompleted``, ``TaskFailed``, ``TaskStalled`` +
  ``TaskDeadLettered``, a stall for pending tasks, mid-step for running ones);
- one task (``Dataset.big_task_id``) has exactly ``BIG_TASK_EVENTS`` events, the others about
  ``events / tasks`` each (at least ``MIN_TASK_EVENTS``);
- some tasks are sub-tasks: ``parent_id`` and ``dispatch_key`` set, their ``TaskStarted`` names
  the parent, and the parent's log holds ``SubAgentDispatched`` / ``SubAgentResultReceived``
  naming the child's id;
- ``recorded_at`` is spread over the last ``DAYS`` days, the events of each task a few seconds
  to a minute apart, running tasks (and the big one) ending in the last minutes; positions follow
  ``recorded_at``, so a task's events lie across the table as concurrent appends leave them;
- hashes are random 64-hex strings linked by ``prev_hash``: the chain does not verify;
- task rows agree with their logs on seq, head hash, status, lease, attempts and times.

Search probes (``Dataset.probes``): a customer id planted in exactly one event's payload, a tool
name that most tasks call, one tool call's idempotency key (and its first 12 characters), a word
that a few hundred thoughts hold, a sub-task's id (inside its parent's payloads), and a two-word
phrase of failed tool calls' errors (about half the tasks). For each,
the loader counts from the generated JSON which events and tasks hold it as a case-insensitive
substring: the ground truth a search index is compared with.
"""

from __future__ import annotations

import hashlib
import json
import random
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

BIG_TASK_EVENTS = 1000
MIN_TASK_EVENTS = 12
DAYS = 7
SEED = 11
NEEDLE = "cus_NEEDLE_4711"
COMMON_TOOL = "crm_lookup"
RARE_WORD = "chargeback"
GENESIS_HASH = "0" * 64

NAMESPACE = "bench"
KINDS = ("support.triage", "billing.refund", "sales.followup", "research.brief", "ops.incident")
AGENTS = tuple(f"agent-{n:02d}" for n in range(12))
TOOLS = (
    "send_email", "crm_lookup", "crm_update", "search_web", "fetch_url", "create_ticket", "refund_payment",
    "calendar_book",
)
# status -> share of the tasks that are not running; about one task in 200 is running (with
# ~100 events a task over 7 days, that is how many run at any moment).
STATUS_MIX = (("completed", 62), ("pending", 14), ("failed", 15), ("dead_lettered", 9))
RUNNING_EVERY = 200
# Vocabulary of the thoughts. RARE_WORD is added to a few; no word here contains it.
SUBJECTS = ("the customer", "the account", "the invoice", "the order", "the ticket", "the lead", "the contract")
VERBS = ("check", "compare", "summarise", "verify", "escalate", "draft a reply about", "look up", "update")
OBJECTS = (
    "the billing history", "the last three orders", "the open tickets", "the shipping address",
    "the renewal date", "the discount policy", "the refund rules", "the service level", "the contact owner",
)
REASONS = (
    "before replying", "because the plan changed", "since the tool answered late", "to avoid a duplicate refund",
    "as the manager asked", "before closing the task", "because the data looked stale", "to confirm the amount",
)
COPY_EVENT_COLUMNS = (
    "position", "task_id", "seq", "type", "payload", "agent", "idempotency_key", "request_digest", "lamport",
    "causation_id", "correlation_id", "trace_id", "recorded_at", "prev_hash", "hash",
)
COPY_TASK_COLUMNS = (
    "id", "namespace", "kind", "status", "input", "output", "error", "metadata", "parent_id", "attempts",
    "max_attempts", "lease_holder", "lease_epoch", "lease_expires_at", "lease_seconds", "dispatch_key", "last_seq",
    "head_hash", "lamport", "created_by", "created_at", "updated_at", "last_event_at",
)


@dataclass(frozen=True)
class Probe:
    """A value to search for, and which events and tasks hold it (case-insensitive substring)."""

    kind: str
    value: str
    # The same value as a containment document, for a jsonb_path_ops index (None: not expressible).
    containment: dict[str, Any] | None
    events: int = 0
    task_ids: frozenset[uuid.UUID] = frozenset()


@dataclass
class Dataset:
    tasks: int
    events: int
    big_task_id: uuid.UUID
    probes: list[Probe]
    # Newest first by (created_at, id), as the dashboard's task list orders them.
    task_order: list[uuid.UUID]
    events_last_hour: int
    generate_seconds: float
    copy_seconds: float
    vacuum_seconds: float


@dataclass
class _Task:
    id: uuid.UUID
    kind: str
    status: str
    length: int
    start: float
    gap: float
    parent: _Task | None = None
    children: list[_Task] = field(default_factory=list)
    dispatch_key: str | None = None
    input: dict[str, Any] = field(default_factory=dict)
    output: dict[str, Any] | None = None
    error: str | None = None
    attempts: int = 0
    epoch: int = 0
    holder: str | None = None
    last_at: float = 0.0
    head_hash: str = GENESIS_HASH


# An event before it has a position: (recorded_at epoch seconds, task index, seq, type,
# payload JSON, agent, prev_hash, hash).
Row = tuple[float, int, int, str, str, str | None, str, str]


class _Generator:
    def __init__(self, rng: random.Random, now: float, customers: list[str]) -> None:
        self.rng = rng
        self.now = now
        self.customers = customers
        # The needle goes into the first tool call from step 3 on of this task.
        self.needle_task = -1
        self.needle_planted = False

    def hex64(self) -> str:
        return f"{self.rng.getrandbits(256):064x}"

    def customer(self) -> str:
        return self.rng.choice(self.customers)

    def sentence(self) -> str:
        rng = self.rng
        return f"{rng.choice(VERBS)} {rng.choice(OBJECTS)} of {rng.choice(SUBJECTS)} {rng.choice(REASONS)}"

    def thought(self) -> str:
        """One to three sentences (about 70 to 250 characters), sometimes naming a customer."""
        rng = self.rng
        text = ". ".join(self.sentence().capitalize() for _ in range(rng.randint(1, 3)))
        if rng.random() < 0.3:
            text += f"; customer {self.customer()} has {rng.randint(1, 9)} open items"
        if rng.random() < 0.0012:
            text += f", possible {RARE_WORD} on order {rng.randint(10000, 99999)}"
        return text

    def tool_input(self, tool: str, customer: str) -> dict[str, Any]:
        rng = self.rng
        if tool == "send_email":
            return {"to": f"{customer[4:].lower()}@example.com", "subject": f"About your {rng.choice(OBJECTS)[4:]}",
                    "body": self.thought()}
        if tool in ("crm_lookup", "crm_update"):
            data: dict[str, Any] = {"customer_id": customer}
            if tool == "crm_update":
                data["fields"] = {"plan": rng.choice(("free", "team", "business")), "note": self.thought()}
            return data
        if tool == "search_web":
            return {"query": f"{rng.choice(OBJECTS)[4:]} {rng.choice(KINDS).split('.')[1]}", "max_results": 5}
        if tool == "fetch_url":
            return {"url": f"https://docs.example.com/{rng.choice(KINDS).replace('.', '/')}/{rng.randint(1, 500)}"}
        if tool == "create_ticket":
            return {"customer_id": customer, "title": self.sentence()[:60], "priority": rng.choice(("low", "high"))}
        if tool == "refund_payment":
            return {"customer_id": customer, "charge_id": f"ch_{rng.getrandbits(64):016x}",
                    "amount_cents": rng.randint(100, 50000), "currency": "eur"}
        return {"attendee": f"{customer[4:].lower()}@example.com", "minutes": rng.choice((15, 30, 60)),
                "start": datetime.fromtimestamp(self.now + rng.randint(3600, 600000), UTC).isoformat()}

    def tool_result(self, tool: str, tool_input: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        rng = self.rng
        if rng.random() < 0.05:
            return "failed", {"error": rng.choice(("timeout", "rate limited", "upstream 502")), "retry_after": 30}
        if tool == "crm_lookup":
            return "succeeded", {"customer_id": tool_input["customer_id"], "plan": rng.choice(("free", "team")),
                                 "open_tickets": rng.randint(0, 5), "owner": rng.choice(AGENTS)}
        if tool == "search_web":
            return "succeeded", {"hits": [{"title": self.sentence()[:50], "url": f"https://example.org/{n}"}
                                          for n in range(3)]}
        if tool == "refund_payment":
            return "succeeded", {"refund_id": f"re_{rng.getrandbits(64):016x}", "state": "pending"}
        if tool == "create_ticket":
            return "succeeded", {"ticket_id": f"T-{rng.randint(100000, 999999)}"}
        return "succeeded", {"ok": True, "ms": rng.randint(20, 2000)}

    def task_log(self, task: _Task, index: int) -> Iterator[tuple[str, dict[str, Any], str | None]]:
        """(type, payload, agent) of each event of ``task``, exactly ``task.length`` of them."""
        rng = self.rng
        # The events its status ends with; a parent that is done has heard from its children.
        tail: list[tuple[str, _Task | None]] = [
            ("SubAgentResultReceived", child) for child in task.children if task.status != "running"
        ]
        tail += {
            "completed": [("TaskCompleted", None)], "failed": [("TaskFailed", None)],
            "dead_lettered": [("TaskStalled", None), ("TaskDeadLettered", None)], "pending": [("TaskStalled", None)],
            "running": [],
        }[task.status]
        task.input = {"customer_id": self.customer(), "channel": rng.choice(("email", "chat", "api")),
                      "message": self.thought(), "priority": rng.randint(1, 4)}
        started = {"kind": task.kind, "input": task.input,
                   "parent_task_id": str(task.parent.id) if task.parent else None, "max_attempts": 3,
                   "metadata": {"dispatch_key": task.dispatch_key} if task.parent else {}}
        yield "TaskStarted", started, None
        yield from self.claim(task)
        step = 0
        for child in task.children:
            step += 1
            yield "SubAgentDispatched", {"child_task_id": str(child.id), "dispatch_key": child.dispatch_key,
                                         "step": step, "kind": child.kind, "input": {"customer_id": self.customer()}}, \
                task.holder
        room = task.length - 2 - len(task.children) - len(tail)
        while room > 0:
            step += 1
            if room >= 2 and rng.random() < 0.015:
                room -= 2
                yield self.stall(task)
                yield from self.claim(task)
                continue
            room -= 1
            thought = {"step": step, "thought": self.thought(), "tokens": rng.randint(50, 4000)}
            yield "ReasoningStepCompleted", thought, task.holder
            if room == 0:
                break
            plant = index == self.needle_task and step >= 3 and not self.needle_planted
            self.needle_planted |= plant
            tool = "refund_payment" if plant else rng.choice(TOOLS)
            key = hashlib.sha256(f"{task.id}:{step}:{tool}".encode()).hexdigest()
            tool_input = self.tool_input(tool, NEEDLE if plant else self.customer())
            room -= 1
            yield "ToolCallDispatched", {"idempotency_key": key, "step": step, "tool": tool, "input": tool_input,
                                         "compensation": None}, task.holder
            if room == 0:
                break
            status, result = self.tool_result(tool, tool_input)
            room -= 1
            yield "ToolCallResultReceived", {"idempotency_key": key, "step": step, "tool": tool, "status": status,
                                             "result": result}, task.holder
        for kind, child in tail:
            if kind == "SubAgentResultReceived" and child is not None:
                yield kind, {"child_task_id": str(child.id), "status": "completed",
                             "output": {"summary": self.thought()}}, None
            elif kind == "TaskCompleted":
                task.output = {"summary": self.thought(), "resolved": True, "steps": step}
                yield kind, {"output": task.output}, task.holder
                task.holder = None
            elif kind == "TaskFailed":
                task.error = f"tool {rng.choice(TOOLS)} kept failing: {rng.choice(('timeout', 'rate limited'))}"
                yield kind, {"error": task.error, "retryable": False}, task.holder
                task.holder = None
            elif kind == "TaskStalled":
                yield self.stall(task)
            else:
                yield kind, {"reason": "attempts exhausted"}, None

    def claim(self, task: _Task) -> Iterator[tuple[str, dict[str, Any], str | None]]:
        task.epoch += 1
        task.holder = self.rng.choice(AGENTS)
        yield "TaskClaimed", {"agent": task.holder, "lease_epoch": task.epoch, "lease_seconds": 300,
                              "expires_at": "(set at load)", "attempt": task.attempts + 1,
                              "recovered": task.attempts > 0}, task.holder

    def stall(self, task: _Task) -> tuple[str, dict[str, Any], str | None]:
        payload = {"reason": "lease expired", "holder": task.holder, "lease_epoch": task.epoch,
                   "seconds_since_last_event": round(self.rng.uniform(300, 900), 3), "attempt": task.attempts + 1,
                   "max_attempts": 3}
        task.attempts += 1
        task.epoch += 1  # a stall fences the holder off
        task.holder = None
        return "TaskStalled", payload, None


def _lengths(rng: random.Random, tasks: int, events: int, big: int) -> list[int]:
    others = tasks - 1
    remaining = events - BIG_TASK_EVENTS
    mean = remaining / others
    if mean < MIN_TASK_EVENTS + 2:
        raise SystemExit(f"--events {events} over --tasks {tasks} leaves under {MIN_TASK_EVENTS + 2} events a task")
    low = max(MIN_TASK_EVENTS, int(mean * 0.3))
    lengths = [rng.randint(low, int(2 * mean - low)) for _ in range(others)]
    # Make the sum exact, one event at a time over the tasks that can give or take one.
    diff = remaining - sum(lengths)
    index = 0
    while diff:
        step = 1 if diff > 0 else -1
        if lengths[index % others] + step >= MIN_TASK_EVENTS:
            lengths[index % others] += step
            diff -= step
        index += 1
    lengths.insert(big, BIG_TASK_EVENTS)
    return lengths


def _copy_text(value: Any) -> str:
    if value is None:
        return "\\N"
    text = value if isinstance(value, str) else str(value)
    return text.replace("\\", "\\\\").replace("\t", "\\t").replace("\n", "\\n").replace("\r", "\\r")


def _iso(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, UTC).isoformat()


def generate(*, tasks: int, events: int, now: float) -> tuple[list[_Task], list[Row], Dataset]:
    """Plan the tasks and generate every event in memory (no database)."""
    rng = random.Random(SEED)
    big = 7 % tasks
    lengths = _lengths(rng, tasks, events, big)
    statuses = [s for s, share in STATUS_MIX for _ in range(share)]
    plan: list[_Task] = []
    window = DAYS * 86400
    for index, length in enumerate(lengths):
        task_id = uuid.UUID(int=rng.getrandbits(128), version=4)
        status = "running" if index == big or index % RUNNING_EVERY == 1 else rng.choice(statuses)
        gap = rng.uniform(2, 60) if index != big else 20.0
        duration = gap * length
        if status == "running":
            # Still going: its last event a few seconds to minutes ago.
            start = now - duration - rng.uniform(1, 600)
        else:
            start = now - duration - rng.uniform(60, window - duration if window > duration + 60 else 61)
        plan.append(_Task(id=task_id, kind=rng.choice(KINDS), status=status, length=length, start=start, gap=gap))
    # Sub-tasks: about one task in a hundred is the child of another (never of itself or the big task).
    links = max(5, tasks // 100)
    candidates = [i for i in range(tasks) if i != big]
    rng.shuffle(candidates)
    for parent_index, child_index in zip(candidates[:links], candidates[links:2 * links], strict=True):
        parent, child = plan[parent_index], plan[child_index]
        child.parent = parent
        child.dispatch_key = hashlib.sha256(f"{parent.id}:{child.kind}".encode()).hexdigest()
        parent.children.append(child)
    customers = [f"cus_{rng.getrandbits(70):018x}"[:18] for _ in range(max(100, tasks // 2))]
    generator = _Generator(rng, now, customers)
    # The needle: in the first tool call from step 3 on of a task that is neither the big one nor
    # in a sub-task link.
    needle_task = candidates[2 * links] if len(candidates) > 2 * links else candidates[-1]
    generator.needle_task = needle_task

    rows: list[Row] = []
    dumps = json.dumps
    for index, task in enumerate(plan):
        at = task.start
        prev = GENESIS_HASH
        for seq, (kind, payload, agent) in enumerate(generator.task_log(task, index), start=1):
            at += task.gap * rng.uniform(0.5, 1.5)
            if kind == "TaskClaimed":
                payload["expires_at"] = _iso(at + 300)
            digest = generator.hex64()
            rows.append((min(at, now - 0.001), index, seq, kind, dumps(payload), agent, prev, digest))
            prev = digest
        if seq != task.length:
            raise AssertionError(f"task {index}: generated {seq} events, planned {task.length}")
        task.last_at = min(at, now - 0.001)
        task.head_hash = prev
    order = sorted(range(tasks), key=lambda i: (plan[i].start, plan[i].id), reverse=True)

    # Ground truth of the probes: which events' payload JSON holds each value.
    key_row = next(r for r in rows if r[1] == candidates[-1] and r[3] == "ToolCallDispatched")
    key = json.loads(key_row[4])["idempotency_key"]
    child = next(t for t in plan if t.parent is not None and t.parent.status != "running")
    specs: list[tuple[str, str, dict[str, Any] | None]] = [
        ("rare value (planted once)", NEEDLE, {"input": {"customer_id": NEEDLE}}),
        ("common tool name", COMMON_TOOL, {"tool": COMMON_TOOL}),
        ("64-hex idempotency key", key, {"idempotency_key": key}),
        ("word from thoughts", RARE_WORD, None),
        ("task UUID (a sub-task's id)", str(child.id), {"child_task_id": str(child.id)}),
        ("two-word phrase (tool errors)", "rate limited", {"result": {"error": "rate limited"}}),
        ("first 12 hex of that key", key[:12], None),
    ]
    probes = []
    for kind, value, containment in specs:
        needle = value.lower()
        hits = [r[1] for r in rows if needle in r[4].lower()]
        probes.append(Probe(kind=kind, value=value, containment=containment, events=len(hits),
                            task_ids=frozenset(plan[i].id for i in hits)))
    if probes[0].events != 1:
        raise AssertionError(f"{NEEDLE} is in {probes[0].events} events, not one")
    dataset = Dataset(
        tasks=tasks, events=len(rows), big_task_id=plan[big].id, probes=probes,
        task_order=[plan[i].id for i in order], events_last_hour=sum(1 for r in rows if r[0] >= now - 3600),
        generate_seconds=0.0, copy_seconds=0.0, vacuum_seconds=0.0,
    )
    return plan, rows, dataset


def _task_line(task: _Task) -> str:
    created = _iso(task.start)
    last = _iso(task.last_at)
    leased = task.holder is not None
    values = (
        str(task.id), NAMESPACE, task.kind, task.status, json.dumps(task.input),
        json.dumps(task.output) if task.output is not None else None, task.error,
        json.dumps({"dispatch_key": task.dispatch_key} if task.parent else {}),
        str(task.parent.id) if task.parent else None, task.attempts, 3, task.holder if leased else None, task.epoch,
        _iso(task.last_at + 300) if leased else None, 300, task.dispatch_key, task.length, task.head_hash,
        task.length, "bench", created, last, last,
    )
    return "\t".join(map(_copy_text, values)) + "\n"


def load(url: str, *, tasks: int, events: int) -> Dataset:
    """Generate and COPY the data set into the migrated database at ``url``; VACUUM ANALYZE."""
    import psycopg

    started = time.perf_counter()
    plan, rows, dataset = generate(tasks=tasks, events=events, now=time.time() - 1)
    rows.sort(key=lambda r: r[0])
    dataset.generate_seconds = time.perf_counter() - started

    started = time.perf_counter()
    with psycopg.connect(url) as conn, conn.cursor() as cursor:
        with cursor.copy(f"COPY backplane_task ({', '.join(COPY_TASK_COLUMNS)}) FROM STDIN") as copy:
            copy.write("".join(_task_line(task) for task in plan))
        ids = [str(task.id) for task in plan]
        with cursor.copy(f"COPY backplane_event ({', '.join(COPY_EVENT_COLUMNS)}) FROM STDIN") as copy:
            chunk: list[str] = []
            for position, (at, index, seq, kind, payload, agent, prev, digest) in enumerate(rows, start=1):
                chunk.append(
                    f"{position}\t{ids[index]}\t{seq}\t{kind}\t{_copy_text(payload)}\t{_copy_text(agent)}\t\\N\t\\N"
                    f"\t{seq}\t\\N\t\\N\t\\N\t{_iso(at)}\t{prev}\t{digest}\n"
                )
                if len(chunk) == 10000:
                    copy.write("".join(chunk))
                    chunk.clear()
            copy.write("".join(chunk))
    dataset.copy_seconds = time.perf_counter() - started
    del rows

    started = time.perf_counter()
    with psycopg.connect(url, autocommit=True) as conn:
        # Explicit positions bypass the identity sequence: move it past them for later inserts.
        conn.execute("SELECT setval(pg_get_serial_sequence('backplane_event', 'position'), max(position))"
                     " FROM backplane_event")
        # As autovacuum would leave tables this size: statistics and a visibility map.
        conn.execute("VACUUM ANALYZE backplane_task")
        conn.execute("VACUUM ANALYZE backplane_event")
    dataset.vacuum_seconds = time.perf_counter() - started
    return dataset


def write_payloads(count: int, *, avoid: list[str]) -> list[tuple[str, str]]:
    """``count`` (type, payload JSON) of the same mix as the load, none holding any of ``avoid``
    (so inserting them does not change what the probes find)."""
    rng = random.Random(SEED + 1)
    now = time.time()
    generator = _Generator(rng, now, [f"cus_{rng.getrandbits(70):018x}"[:18] for _ in range(100)])
    lowered = [value.lower() for value in avoid]
    out: list[tuple[str, str]] = []
    while len(out) < count:
        task = _Task(id=uuid.UUID(int=rng.getrandbits(128), version=4), kind=rng.choice(KINDS), status="running",
                     length=100, start=now, gap=1.0)
        for kind, payload, _agent in generator.task_log(task, -1):
            text = json.dumps(payload)
            if not any(value in text.lower() for value in lowered):
                out.append((kind, text))
    return out[:count]
