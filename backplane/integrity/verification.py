"""Periodic chain verification: every task's hash chain re-checked, each run recorded, each
break raised as an alert that a person acknowledges (docs/design.md, "Integrity and audit").

Two modes:

- **incremental** (every minute): a task's chain is checked only from where the previous
  run left it (its ``VerifiedHead``) up to the task's current head. The history behind the
  head is pinned by one indexed lookup per task: the event at ``verified_seq`` must still
  carry ``verified_hash``, or something at or before it was rewritten.
- **full** (every few hours): every chain from seq 1 with ``chain_verify``. This also catches
  an edit behind the head that left the stored hashes alone, which only recomputing shows.
  Then the seals (``verification_run_seals``): every sealed event's hash recomputed from its
  content, the Merkle tree rebuilt and its root checked against the signed tree head, which
  catches even an edit re-hashed consistently through the chain and the task row.

Every hash is recomputed with ``backplane.integrity.independent_hash``, never with the writer's
own hashing code (``backplane.eventlog.canonical`` / ``chain``): a checker sharing the writer's code
would share its bugs, e.g. a hash that leaves ``prev_hash`` or the payload out.

Both also prove each checked task's row is what its log makes of it (docs/design.md, "the log is the
truth"): the pass that hashes the events folds them through the reducer too, and the result is
compared with the row read together with the head. An incremental run folds only the new events,
on top of the checkpoint (``VerifiedHead.projection``) kept with the verified head; a full run
replays from scratch. A row that differs raises a ``projection`` alert at the row's ``last_seq``;
the chain itself is fine, so the head still moves, and the checkpoint is what the log says.

A run is one ``VerificationRun`` row and a loop of batches of tasks (``verification_run_batch``);
each batch writes what it found (verified heads, alerts, the run's counters) in one transaction.
A broken chain never moves its task's verified head, so every later run finds the break again;
an alert is raised once per finding (task, kind, seq), and later runs only count it.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from celery import current_app
from django.db import connection, transaction
from django.db.models import F, OuterRef, Subquery
from django.utils import timezone

from backplane.eventlog.chain import GENESIS_HASH
from backplane.eventlog.errors import AlreadyDecided, InvalidInput, NotFound
from backplane.eventlog.models import Event, Task
from backplane.eventlog.projections import describe_differences, projection_replay
from backplane.eventlog.reducer import (
    REDUCED_FIELDS,
    TaskState,
    projection_differences,
    task_state_as_json,
    task_state_from_json,
    task_state_of,
)
from backplane.eventlog.selectors import ChainVerification, chain_verify, chain_verify_range, use_c_timestamp_loader
from backplane.integrity import independent_hash, merkle, sealing
from backplane.integrity.models import (
    IntegrityAlert,
    IntegrityAlertKind,
    MerkleLeaf,
    SignedTreeHead,
    VerificationMode,
    VerificationRun,
    VerifiedHead,
)

logger = logging.getLogger(__name__)


# --- one run: start, batches, finish -----------------------------------------------------------


@dataclass(frozen=True)
class _Head:
    """A task's row as a batch sees it (the reducer's fields, read in one go, so ``last_seq``
    bounds the log the rest is compared with), its verified head and the hash now stored there."""

    task_id: uuid.UUID
    row: TaskState
    verified_seq: int
    verified_hash: str
    pinned_hash: str | None  # the hash the event at verified_seq carries now (None: it is gone)
    checkpoint: TaskState | None = None  # the projection through verified_seq, if one was kept

    @property
    def last_seq(self) -> int:
        return self.row.last_seq

    @property
    def head_hash(self) -> str:
        return self.row.head_hash

    @property
    def history_changed(self) -> bool:
        return self.verified_seq > 0 and self.pinned_hash != self.verified_hash


@dataclass(frozen=True)
class _Outcome:
    task_id: uuid.UUID
    events_checked: int
    verified: tuple[int, str] | None = None  # the new verified head (seq, hash), if it moves
    checkpoint: TaskState | None = None  # the projection through the new verified head
    broken: tuple[int, str] | None = None  # (first bad seq, problem)
    drifted: tuple[int, str] | None = None  # (the row's last_seq, the fields where it differs)

    @property
    def failed(self) -> bool:
        return self.broken is not None or self.drifted is not None


@dataclass(frozen=True)
class VerifyStep:
    tasks_checked: int
    events_checked: int
    failures: int
    alerts_raised: int
    last_task_id: uuid.UUID | None  # where the next batch starts; None when there was nothing left


def verification_run_start(*, mode: str, requested_by: str = "", tasks_total: int | None = None) -> VerificationRun:
    if mode not in VerificationMode.values:
        raise InvalidInput(f"unknown verification mode {mode!r}", {"mode": "incremental or full"})
    total = Task.objects.count() if tasks_total is None else tasks_total
    return VerificationRun.objects.create(mode=mode, started_at=timezone.now(), tasks_total=total,
                                          requested_by=requested_by)


# The wire name of the Celery task that runs a requested full run (integrity/tasks.py declares it
# under this name); enqueued by name, so this module does not import the task module that imports it.
VERIFY_CHAINS_REQUESTED = "backplane.tasks.verify_chains_requested"


def verification_run_request_full(*, requested_by: str) -> VerificationRun:
    """A full run of every chain, asked for by a person: the run is recorded now and the worker
    runs it (``VERIFY_CHAINS_REQUESTED``) once this commits."""
    with transaction.atomic(durable=True):
        run = verification_run_start(mode=VerificationMode.FULL, requested_by=requested_by)
        transaction.on_commit(lambda: current_app.signature(VERIFY_CHAINS_REQUESTED, args=(run.pk,)).delay())
    return run


def verification_run_batch(
    *, run: VerificationRun, after_task_id: uuid.UUID | None, batch_size: int,
    task_ids: list[uuid.UUID] | None = None,
) -> VerifyStep:
    """Verify the next ``batch_size`` tasks (in id order, after ``after_task_id``; only those
    of ``task_ids`` when given) and record what was found in one transaction. Returns an
    empty step when no task is left."""
    heads = _heads_after(after_task_id=after_task_id, batch_size=batch_size, task_ids=task_ids)
    if not heads:
        return VerifyStep(0, 0, 0, 0, None)
    verify = _verify_full if run.mode in (VerificationMode.FULL, VerificationMode.ON_DEMAND) else _verify_incremental
    outcomes = [_pruned_meanwhile(head, verify) for head in heads]

    now = timezone.now()
    raised: list[IntegrityAlert] = []
    with transaction.atomic(durable=True):
        # Retention (recovery/retention.py) may have pruned a task since it was read: whatever
        # was found about it is moot and nothing is written for it (its rows would refer to no
        # task). The others are share-locked until this commits, so none goes meanwhile (the
        # pruning function skips a task it cannot lock).
        present = _lock_present([outcome.task_id for outcome in outcomes])
        outcomes = [outcome for outcome in outcomes if outcome.task_id in present]
        failed = [outcome for outcome in outcomes if outcome.failed]
        # Two runs may overlap (a slow incremental run and the next, or a full pass): each
        # head they write is a true (seq, hash) of the chain, so if the older one commits
        # last the head only moves back, and the next run re-checks those events. The checkpoint
        # goes in the same row as its head, so the two always describe the same seq.
        moved = [
            VerifiedHead(
                task_id=o.task_id,
                verified_seq=o.verified[0],
                verified_hash=o.verified[1],
                projection=None if o.checkpoint is None else task_state_as_json(o.checkpoint),
                verified_at=now,
            )
            for o in outcomes
            if o.verified
        ]
        VerifiedHead.objects.bulk_create(
            moved,
            update_conflicts=True,
            unique_fields=["task"],
            update_fields=["verified_seq", "verified_hash", "projection", "verified_at"],
        )
        for outcome in outcomes:
            findings = ((IntegrityAlertKind.CHAIN, outcome.broken), (IntegrityAlertKind.PROJECTION, outcome.drifted))
            for kind, finding in findings:
                if finding is None:
                    continue
                seq, problem = finding
                # The unique constraint on (task, kind, first_invalid_seq) settles a race between
                # two overlapping runs: get_or_create falls back to the row the other one inserted.
                alert, created = IntegrityAlert.objects.get_or_create(
                    task_id=outcome.task_id,
                    kind=kind,
                    first_invalid_seq=seq,
                    defaults={"run": run, "problem": problem, "created_at": now},
                )
                if created:
                    raised.append(alert)
        events_checked = sum(outcome.events_checked for outcome in outcomes)
        VerificationRun.objects.filter(pk=run.pk).update(
            tasks_checked=F("tasks_checked") + len(outcomes),
            events_checked=F("events_checked") + events_checked,
            failures=F("failures") + len(failed),
        )
    for alert in raised:
        what = "row differs from its log" if alert.kind == IntegrityAlertKind.PROJECTION else "chain broken"
        logger.warning(
            "integrity alert %d: task %s %s at seq %d (%s)",
            alert.pk, alert.task_id, what, alert.first_invalid_seq, alert.problem,
        )
    # Every task read counts here (the caller goes on while there are any), pruned ones included.
    return VerifyStep(len(heads), events_checked, len(failed), len(raised), heads[-1].task_id)


def _pruned_meanwhile(head: _Head, verify: Callable[[_Head], _Outcome]) -> _Outcome:
    """``verify(head)``, or nothing found when the task went (pruned) while it was checked."""
    try:
        return verify(head)
    except Task.DoesNotExist:
        return _Outcome(head.task_id, 0)


def _lock_present(task_ids: list[uuid.UUID]) -> set[uuid.UUID]:
    """Which of these tasks still exist, each locked FOR KEY SHARE until the transaction ends."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT id FROM backplane_task WHERE id = ANY(%s) ORDER BY id FOR KEY SHARE", [task_ids])
        return {row[0] for row in cursor.fetchall()}


def task_chain_verify_now(*, task_id: uuid.UUID, requested_by: str = "") -> VerificationRun:
    """One task's whole chain and row checked now and recorded like any run (its head moves,
    a break raises an alert), as a run of its own mode so the periodic runs' figures stay theirs."""
    if not Task.objects.filter(pk=task_id).exists():
        raise NotFound("no such task")
    run = verification_run_start(mode=VerificationMode.ON_DEMAND, requested_by=requested_by, tasks_total=1)
    verification_run_batch(run=run, after_task_id=None, batch_size=1, task_ids=[task_id])
    return verification_run_finish(run_id=run.pk)


def verification_run_finish(*, run_id: int) -> VerificationRun:
    VerificationRun.objects.filter(pk=run_id).update(finished_at=timezone.now())
    return VerificationRun.objects.get(pk=run_id)


def _heads_after(
    *, after_task_id: uuid.UUID | None, batch_size: int, task_ids: list[uuid.UUID] | None = None
) -> list[_Head]:
    """One query: the tasks (the reducer's fields), their verified heads with checkpoints and
    the hash stored at each head now (an index lookup on (task, seq) per task)."""
    pinned = Event.objects.filter(task_id=OuterRef("pk"), seq=OuterRef("verified_head__verified_seq")).values("hash")
    tasks = Task.objects.order_by("pk")
    if task_ids is not None:
        tasks = tasks.filter(pk__in=task_ids)
    if after_task_id is not None:
        tasks = tasks.filter(pk__gt=after_task_id)
    rows = tasks.annotate(pinned_hash=Subquery(pinned[:1])).values_list(
        "pk",
        "verified_head__verified_seq",
        "verified_head__verified_hash",
        "verified_head__projection",
        "pinned_hash",
        *REDUCED_FIELDS,
    )[:batch_size]
    return [
        _Head(
            task_id,
            TaskState(**dict(zip(REDUCED_FIELDS, row, strict=True))),
            verified_seq or 0,
            verified_hash or GENESIS_HASH,
            pinned_hash,
            None if checkpoint is None else task_state_from_json(checkpoint),
        )
        for task_id, verified_seq, verified_hash, checkpoint, pinned_hash, *row in rows
    ]


def _verify_incremental(head: _Head) -> _Outcome:
    if head.history_changed:
        found = chain_check(task=Task.objects.get(pk=head.task_id))
        return _Outcome(head.task_id, found.checked, broken=_rewrite_break(head, found))
    if head.last_seq < head.verified_seq:
        return _Outcome(
            head.task_id,
            0,
            broken=(
                head.last_seq + 1,
                f"the task records {head.last_seq} events but {head.verified_seq} were verified before",
            ),
        )
    if head.last_seq == head.verified_seq:
        if head.head_hash != head.verified_hash:
            return _Outcome(
                head.task_id, 0, broken=(head.last_seq, "the task's head_hash differs from the last verified hash")
            )
        return _Outcome(head.task_id, 0)
    checkpoint = head.checkpoint
    if checkpoint is None:
        # Verified before checkpoints were kept: replay the verified part once (no hashing,
        # only the transitions' payloads); the head written for this run carries one.
        checkpoint = projection_replay(task_id=head.task_id, through_seq=head.verified_seq)
    result = chain_verify_range(
        row_hash=independent_hash.row_hash,
        task_id=head.task_id,
        after_seq=head.verified_seq,
        after_hash=head.verified_hash,
        through_seq=head.last_seq,
        through_hash=head.head_hash,
        replay_from=checkpoint,
    )
    if not result.valid:
        return _Outcome(head.task_id, result.checked, broken=_reported(result))
    return _projection_compared(head.task_id, head.row, result)


def _verify_full(head: _Head) -> _Outcome:
    result, row = _chain_verify_confirmed(head)
    # A rewrite that was re-hashed all the way to the head (task row included) is a valid
    # chain: only the head pinned by an earlier run shows it, and overwriting that head
    # with the new hash would launder the rewrite.
    if head.history_changed:
        return _Outcome(head.task_id, result.checked, broken=_rewrite_break(head, result))
    if not result.valid:
        return _Outcome(head.task_id, result.checked, broken=_reported(result))
    return _projection_compared(head.task_id, row, result)


def _projection_compared(task_id: uuid.UUID, row: TaskState, result: ChainVerification) -> _Outcome:
    """A valid chain's outcome: the head moves to the row's, with the replayed projection as its
    checkpoint, and a row that is not that projection is a finding at the row's ``last_seq``.

    ``row`` was read together with the ``last_seq`` that bounded the replay, so an append
    racing the check cannot make the two differ (the same rule as ``projection_check``)."""
    replayed = result.state
    if replayed is None:  # every caller asked for a replay; a valid chain always folds
        raise AssertionError("chain verified without a replay")
    differences = projection_differences(row, replayed)
    return _Outcome(
        task_id,
        result.checked,
        verified=(row.last_seq, result.head_hash),
        checkpoint=replayed,
        drifted=(row.last_seq, describe_differences(differences)) if differences else None,
    )


def _reported(result: ChainVerification) -> tuple[int, str]:
    """(first bad seq, problem) of a failed verification; both are set whenever valid is False."""
    return result.first_invalid_seq or 0, result.problem or ""


def _chain_verify_confirmed(head: _Head) -> tuple[ChainVerification, TaskState]:
    """The whole chain checked and replayed from scratch, and the row it was checked against."""
    result = chain_verify_range(
        row_hash=independent_hash.row_hash,
        task_id=head.task_id,
        after_seq=0,
        after_hash=GENESIS_HASH,
        through_seq=head.last_seq,
        through_hash=head.head_hash,
        replay_from=TaskState(),
    )
    if result.valid:
        return result, head.row
    # The log is read after the task row was: an append committed in between looks like a log
    # longer than the task records. Before calling the chain broken, check again with the row
    # locked, so no append can slip in (they wait for this lock).
    with transaction.atomic(durable=True):
        task = Task.objects.select_for_update().get(pk=head.task_id)
        return chain_check(task=task, replay_from=TaskState()), task_state_of(task)


def chain_check(*, task: Task, replay_from: TaskState | None = None) -> ChainVerification:
    """The one chain check (the API, the periodic runs, ``manage.py verify_chain``): the log's
    numbering and links, and every hash recomputed by ``independent_hash``, never by the
    writer's own hashing, which would agree with any mistake the writer makes."""
    return chain_verify(task=task, replay_from=replay_from, row_hash=independent_hash.row_hash)


def chains_check(*, task_ids: list[uuid.UUID] | None = None) -> Iterator[ChainVerification]:
    """``chain_check`` of every task (or of ``task_ids``), oldest first."""
    tasks = Task.objects.order_by("created_at", "id")
    if task_ids is not None:
        tasks = tasks.filter(pk__in=task_ids)
    for task in tasks.iterator(chunk_size=500):
        yield chain_check(task=task)


def _rewrite_break(head: _Head, found: ChainVerification) -> tuple[int, str]:
    """Where to report a change behind the verified head.

    chain_check names the first bad seq when it finds one at or before the pinned seq.
    Otherwise the history was rewritten and re-hashed consistently up to there (a
    problem chain_check reports further on, say a stale task row, changes nothing),
    and the pinned seq is the first one that can be proved bad.
    """
    pinned = head.verified_seq
    prefix = f"history verified through seq {pinned} has changed"
    if not found.valid and found.first_invalid_seq is not None and found.first_invalid_seq <= pinned:
        return found.first_invalid_seq, f"{prefix}: {found.problem}"
    what = "is missing" if head.pinned_hash is None else "no longer carries the verified hash"
    return pinned, f"{prefix}: the event at seq {pinned} {what} (rewritten and re-hashed at or before it)"


# --- seals: the signed tree head against the events' content ------------------------------------

# A page of sealed events in leaf order: the leaf's sealed hash, the tree size the audit export
# covers (in the same snapshot), and the columns the event's hash covers
# (independent_hash.HASHED_EVENT_COLUMNS, in order), NULL where retention pruned the event. A
# bounded range of leaf indices, as in sealing.seal_verify_against_head.
_SEALED_PAGE_SQL = """
SELECT l.leaf_index, l.event_hash, (SELECT coalesce(max(s.tree_size), 0) FROM backplane_auditsegment s),
       e.position, e.task_id, e.seq, e.type, e.payload, e.agent, e.idempotency_key, e.lamport,
       e.causation_id, e.correlation_id, e.trace_id, e.recorded_at, e.prev_hash
FROM backplane_merkleleaf l LEFT JOIN backplane_event e ON e.position = l.event_id
WHERE l.leaf_index >= %s AND l.leaf_index < %s
ORDER BY l.leaf_index
"""
_SEALED_PAGE_SIZE = 5000


@dataclass(frozen=True)
class SealFinding:
    """What the seal check found wrong: where (the first bad leaf's event, when it can be told)
    and what."""

    problem: str
    leaf_index: int | None = None
    task_id: uuid.UUID | None = None
    seq: int | None = None


@dataclass(frozen=True)
class SealCheck:
    tree_size: int  # of the signed head checked (0: nothing sealed yet)
    finding: SealFinding | None = None
    # Leaves whose events retention pruned after their export (recovery/retention.py): taken at
    # their sealed hash, vouched for by the export and its offline verifier.
    pruned: int = 0

    @property
    def valid(self) -> bool:
        return self.finding is None


def seals_verify(*, head: SignedTreeHead | None = None) -> SealCheck:
    """Check the latest signed tree head (or ``head``) against what the events say now.

    Every sealed event's hash is recomputed from its content (never read from its ``hash``
    column) with ``independent_hash``, the tree is rebuilt from those hashes, and its root must
    be the signed one, under a signature that verifies. The first leaf whose event no longer
    hashes to the hash it was sealed with is named; when every leaf matches its sealed copy but
    the root does not (the leaf table was rewritten as well), the head's stored frontier, if it
    still matches the signed root, narrows the change to one perfect subtree and its first leaf
    is named.

    A leaf whose event is gone counts at its sealed hash when it lies below the tree size the
    audit export covers (retention pruned it; the export holds it, verifiable offline) and is
    counted in ``pruned``. Above that size a missing event is a finding: nothing may delete it.
    """
    head = head or SignedTreeHead.objects.order_by("-tree_size").first()
    if head is None:
        return SealCheck(0)
    if not sealing.verify_tree_head(tree_size=head.tree_size, root_hash=head.root_hash, signed_at=head.signed_at,
                                    signature=head.signature, public_key=head.public_key):
        return SealCheck(head.tree_size, SealFinding("the tree head's signature does not verify"))
    frontier = merkle.CompactRange()
    first_bad: SealFinding | None = None
    pruned = 0
    with connection.cursor() as cursor:
        use_c_timestamp_loader(cursor)
        while frontier.size < head.tree_size:
            page_end = min(frontier.size + _SEALED_PAGE_SIZE, head.tree_size)
            cursor.execute(_SEALED_PAGE_SQL, [frontier.size, page_end])
            rows = cursor.fetchall()
            for leaf_index, sealed_hash, exported, position, *columns in rows:
                if leaf_index != frontier.size:
                    return SealCheck(head.tree_size, first_bad or SealFinding(f"leaf {frontier.size} is missing"))
                if position is None:
                    if leaf_index >= exported:
                        return SealCheck(head.tree_size, first_bad or SealFinding(
                            f"the event of leaf {leaf_index} is missing (it was not exported)", leaf_index))
                    frontier.append(merkle.event_leaf_hash(sealed_hash))
                    pruned += 1
                    continue
                recomputed = independent_hash.row_hash(columns)
                if recomputed != sealed_hash and first_bad is None:
                    first_bad = SealFinding(
                        f"seal: the event of leaf {leaf_index} no longer hashes to the hash it was sealed with",
                        leaf_index, columns[0], columns[1],
                    )
                frontier.append(merkle.event_leaf_hash(recomputed))
            if frontier.size < page_end:
                break  # the last leaves (or their events) are gone: reported below
    if first_bad is not None:
        return SealCheck(head.tree_size, first_bad, pruned)
    if frontier.size != head.tree_size:
        return SealCheck(head.tree_size, SealFinding(f"leaf {frontier.size} of {head.tree_size} is missing"), pruned)
    if frontier.root().hex() != head.root_hash:
        return SealCheck(head.tree_size, _located_by_frontier(head, frontier), pruned)
    return SealCheck(head.tree_size, pruned=pruned)


def _located_by_frontier(head: SignedTreeHead, recomputed: merkle.CompactRange) -> SealFinding:
    problem = "seal: the events no longer hash to the signed root"
    try:
        stored = merkle.CompactRange.from_hex(head.tree_size, head.frontier)
    except ValueError:
        return SealFinding(problem)
    if stored.root().hex() != head.root_hash:
        return SealFinding(problem)  # the frontier was rewritten too: it locates nothing
    # The frontier's subtrees, largest (leftmost) first, one per set bit of the size.
    start = 0
    sizes = [1 << bit for bit in reversed(range(head.tree_size.bit_length())) if head.tree_size >> bit & 1]
    for size, ours, theirs in zip(sizes, recomputed.hashes, stored.hashes, strict=True):
        if ours != theirs:
            where = f"{problem}; the change lies in leaves {start}..{start + size - 1}"
            leaf = MerkleLeaf.objects.filter(leaf_index=start).first()
            # The leaf's event may be gone (pruned after its export): then there is no task to name.
            event = Event.objects.filter(position=leaf.event_id).only("task_id", "seq").first() if leaf else None
            if event is None:
                return SealFinding(where, start if leaf else None)
            return SealFinding(where, start, event.task_id, event.seq)
        start += size
    return SealFinding(problem)


def verification_run_seals(*, run: VerificationRun) -> SealCheck:
    """The seal check as part of a run: a finding counts as a failure of the run and raises an
    alert (kind ``chain``: an event whose content changed is a broken chain, and the full run's
    chain check, finding the same (task, seq), then shares the one alert) at the first bad leaf's
    event. A finding that names no event (a bad signature, a missing leaf) has no task to hang an
    alert on: it is counted and logged."""
    checked = seals_verify()
    finding = checked.finding
    if finding is None:
        return checked
    now = timezone.now()
    with transaction.atomic(durable=True):
        VerificationRun.objects.filter(pk=run.pk).update(failures=F("failures") + 1)
        if finding.task_id is not None and finding.seq is not None:
            alert, created = IntegrityAlert.objects.get_or_create(
                task_id=finding.task_id,
                kind=IntegrityAlertKind.CHAIN,
                first_invalid_seq=finding.seq,
                defaults={"run": run, "problem": finding.problem, "created_at": now},
            )
            if created:
                logger.warning("integrity alert %d: task %s sealed event at seq %d changed (%s)",
                               alert.pk, alert.task_id, alert.first_invalid_seq, alert.problem)
    logger.warning("seal verification of tree size %d failed: %s", checked.tree_size, finding.problem)
    return checked


# --- people and the dashboard -------------------------------------------------------------------


def integrity_alert_acknowledge(*, alert_id: int, by: str, note: str) -> IntegrityAlert:
    """Record that a person has seen a broken chain and what they did about it. Once only:
    the row lock and the check make a second, concurrent acknowledgement fail."""
    note = (note or "").strip()
    if not note:
        raise InvalidInput("a note is required", {"note": "required"})
    with transaction.atomic(durable=True):
        alert = IntegrityAlert.objects.select_for_update().filter(pk=alert_id).first()
        if alert is None:
            raise NotFound("integrity alert not found", {"id": alert_id})
        if alert.acknowledged_at is not None:
            raise AlreadyDecided(
                "this alert was already acknowledged",
                {"acknowledged_by": alert.acknowledged_by, "acknowledged_at": alert.acknowledged_at.isoformat()},
            )
        alert.acknowledged_by = by
        alert.acknowledged_at = timezone.now()
        alert.note = note
        alert.save(update_fields=["acknowledged_by", "acknowledged_at", "note"])
    return alert


@dataclass(frozen=True)
class IntegritySummary:
    """What the dashboard's integrity page and /metrics show.

    The last runs are the last *finished* ones: a verifier that died or hangs shows as a
    last run older than its schedule.
    """

    last_incremental: VerificationRun | None
    last_full: VerificationRun | None
    open_alert_count: int
    open_alerts: list[IntegrityAlert]  # newest first, at most ``alert_limit``


def integrity_summary(*, alert_limit: int = 50) -> IntegritySummary:
    finished = VerificationRun.objects.filter(finished_at__isnull=False).order_by("-finished_at", "-pk")
    open_alerts = IntegrityAlert.objects.filter(acknowledged_at__isnull=True)
    return IntegritySummary(
        last_incremental=finished.filter(mode=VerificationMode.INCREMENTAL).first(),
        last_full=finished.filter(mode=VerificationMode.FULL).first(),
        open_alert_count=open_alerts.count(),
        open_alerts=list(open_alerts.select_related("task").order_by("-created_at", "-pk")[:alert_limit])
        if alert_limit
        else [],
    )
