"""The integrity page: runs and their progress, alerts, seals, and proof bundles checked offline."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from django.contrib.auth.models import Permission, User
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from backplane.integrity import sealing
from backplane.integrity.models import IntegrityAlert, VerificationRun
from backplane.integrity.tasks import verify_chains_requested
from tests.dashboard.conftest import History, html

ROOT = Path(__file__).resolve().parents[2]


def test_the_page_shows_runs_alerts_seals_and_exports(olivia_client: Client, make_history: Any) -> None:
    history: History = make_history()
    sealing.seal_new_events()
    run = VerificationRun.objects.create(mode="full", started_at=history.task.created_at)
    IntegrityAlert.objects.create(run=run, task=history.task, kind="chain", first_invalid_seq=4, problem="rewritten",
                                  created_at=history.task.created_at)
    page = html(olivia_client.get("/integrity/"))
    assert 'data-alert="' in page and "rewritten" in page and "#seq-4" in page
    assert f'data-run="{run.pk}"' in page
    assert 'id="seal-data"' in page and '"sizes": [' in page
    assert "check-proof" in page and sealing.public_key_hex() in page


def test_verify_all_is_recorded_then_run_by_the_worker_with_progress(olivia_client: Client, make_history: Any,
                                                                    make_task: Any) -> None:
    make_history()
    make_task()
    response = olivia_client.post("/integrity/verify-all/", HTTP_ACCEPT="application/json")
    assert response.status_code == 202
    queued = response.json()
    assert queued["finished_at"] is None and queued["tasks_total"] == 3 and queued["percent"] == 0
    run = VerificationRun.objects.get(pk=queued["id"])
    assert run.requested_by == "olivia" and run.mode == "full"
    verify_chains_requested(run.pk)  # what the worker does with the message
    progress = olivia_client.get(f"/integrity/runs/{run.pk}/").json()
    assert progress["finished_at"] and progress["percent"] == 100 and progress["tasks_checked"] == 3
    assert progress["failures"] == 0


def test_acknowledging_an_alert_needs_the_permission(olivia: User, olivia_client: Client, make_history: Any) -> None:
    history: History = make_history()
    run = VerificationRun.objects.create(mode="full", started_at=history.task.created_at)
    alert = IntegrityAlert.objects.create(run=run, task=history.task, kind="chain", first_invalid_seq=2,
                                          problem="x", created_at=history.task.created_at)
    assert olivia_client.post(f"/integrity/alerts/{alert.pk}/acknowledge/", {"note": "seen"}).status_code == 403
    alert.refresh_from_db()
    assert alert.acknowledged_at is None
    olivia.user_permissions.add(Permission.objects.get(codename="acknowledge_integrityalert"))
    client = Client()
    client.force_login(User.objects.get(pk=olivia.pk))
    response = client.post(f"/integrity/alerts/{alert.pk}/acknowledge/", {"note": "restored from backup"})
    assert response.status_code == 302
    alert.refresh_from_db()
    assert alert.acknowledged_by == "olivia" and alert.note == "restored from backup"


def check_proof(path: Path, key: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "backplane.integrity.audit", "check-proof", str(path), "--public-key", key],
        cwd=ROOT, capture_output=True, text=True, timeout=60, env={"PATH": "/usr/bin:/bin"},
    )


def test_a_downloaded_proof_checks_offline_and_a_tampered_one_does_not(olivia_client: Client, make_history: Any,
                                                                      tmp_path: Path) -> None:
    history: History = make_history()
    sealing.seal_new_events()
    response = olivia_client.get("/integrity/proof/", {"task_id": str(history.task.pk), "seq": "4"})
    assert response.status_code == 200
    assert response["Content-Disposition"] == f'attachment; filename="proof-{history.task.pk}-4.json"'
    bundle = json.loads(response.content)
    path = tmp_path / "proof.json"
    path.write_text(json.dumps(bundle))
    key = sealing.public_key_hex()
    checked = check_proof(path, key)
    assert checked.returncode == 0, checked.stderr
    assert checked.stdout.startswith(f"OK: event {history.task.pk}#4")

    bundle["event"]["payload"]["tool"] = "something_else"
    path.write_text(json.dumps(bundle))
    tampered = check_proof(path, key)
    assert tampered.returncode == 1 and "hashes to" in tampered.stderr
    bundle = json.loads(response.content)
    bundle["audit_path"][0] = "00" * 32
    path.write_text(json.dumps(bundle))
    assert check_proof(path, key).returncode == 1
    assert check_proof(tmp_path / "proof.json", "11" * 32).returncode in (1, 2)


def test_a_proof_for_an_unsealed_or_unknown_event_is_a_message_not_a_500(olivia_client: Client,
                                                                         make_history: Any) -> None:
    history: History = make_history()
    response = olivia_client.get("/integrity/proof/", {"task_id": str(history.task.pk), "seq": "1"}, follow=True)
    assert response.status_code == 200 and "No proof for" in html(response)
    response = olivia_client.get("/integrity/proof/", {"task_id": "nope", "seq": "x"}, follow=True)
    assert "Give a task id" in html(response)


def test_the_page_runs_the_same_queries_for_more_runs(olivia_client: Client, make_history: Any) -> None:
    history: History = make_history()

    def count() -> int:
        with CaptureQueriesContext(connection) as captured:
            assert olivia_client.get("/integrity/").status_code == 200
        return len(captured.captured_queries)

    few = count()
    VerificationRun.objects.bulk_create(
        VerificationRun(mode="incremental", started_at=history.task.created_at, finished_at=history.task.created_at)
        for _ in range(200)
    )
    for _ in range(20):
        sealing.seal_new_events()
    assert count() == few <= 10
