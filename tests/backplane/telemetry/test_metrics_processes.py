"""Counters summed across processes: two real OS processes append through the real service,
each into its own files of one metrics directory, and one scrape of /metrics adds them up.

The processes run Django with the test database (``committed_db``: their commits and ours are
the same database) and the directory given to them as ``BACKPLANE_METRICS_DIR``; /metrics reads
the same directory. Nothing is mocked: the events are in the database and the counts in the files.
Then the whole product as ``make run`` starts it: its web process reports what its worker counted,
and goes on reporting it after the worker was killed.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
from django.test import Client
from prometheus_client.parser import text_string_to_metric_families

from backplane.eventlog.models import Event
from backplane.runtime.launcher import Launcher
from backplane.telemetry.process_files import metrics_process_name
from tests.backplane.runtime.product import ProductClient, RunningProduct, new_var_dir
from tests.backplane.telemetry.metrics_scrape import scrape
from tests.support.live_server import ROOT, database_url_of_test_db
from tests.support.waiting import wait_until

APPENDS = 40

# One agent process: a task of its own, then APPENDS events of a type of the client's own.
AGENT_PROCESS = """
import os, sys
import django

django.setup()
from backplane.eventlog import services
from backplane.eventlog.writer import EventDraft

task = services.task_create(namespace="acme", kind="lead-qualification", input={"pid": os.getpid()}).task
for n in range(int(sys.argv[1])):
    services.event_append(namespace="acme", task_id=task.pk, agent=f"agent-{os.getpid()}",
                          draft=EventDraft(type="LeadScored", payload={"n": n}))
print(os.getpid())
"""


def start_agent_process(*, var_dir: Path, metrics_dir: Path) -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items() if k != "DJANGO_ALLOW_ASYNC_UNSAFE"}
    env.update(
        DJANGO_SETTINGS_MODULE="backplane.settings",
        DATABASE_URL=database_url_of_test_db(),
        BACKPLANE_ENV="test",
        BACKPLANE_DB_POOL="0",
        BACKPLANE_VAR_DIR=str(var_dir),
        BACKPLANE_METRICS_DIR=str(metrics_dir),
        BACKPLANE_LIVE_NOTICES="0",
    )
    # This process's own PROMETHEUS_MULTIPROC_DIR (the run's directory) is in that environment:
    # the child's settings must replace it with BACKPLANE_METRICS_DIR's, never inherit it.
    assert env["PROMETHEUS_MULTIPROC_DIR"] != str(metrics_dir)
    return subprocess.Popen([sys.executable, "-c", AGENT_PROCESS, str(APPENDS)], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_two_processes_counts_are_summed_on_one_scrape(committed_db: None, client: Client, settings: Any,
                                                      tmp_path: Path) -> None:
    metrics_dir = tmp_path / "metrics"
    settings.PROMETHEUS_MULTIPROC_DIR = str(metrics_dir)  # where /metrics reads, as the processes'
    processes = [start_agent_process(var_dir=tmp_path / f"var-{n}", metrics_dir=metrics_dir) for n in range(2)]
    pids = set()
    for process in processes:
        out, err = process.communicate(timeout=120)
        assert process.returncode == 0, err
        pids.add(int(out.split()[-1]))

    assert len(pids) == 2
    # Each process counted into files of its own, named by host and pid; both have exited since.
    assert counted_by(metrics_dir) == pids
    metrics = scrape(client)
    assert Event.objects.filter(type="LeadScored").count() == 2 * APPENDS
    assert metrics.value("backplane_events_appended_total", type="custom") == 2 * APPENDS
    assert metrics.value("backplane_events_appended_total", type="TaskStarted") == 2
    assert metrics.value("backplane_append_duration_seconds_count") == 2 * APPENDS
    assert metrics.value("backplane_append_duration_seconds_bucket", le="+Inf") == 2 * APPENDS
    # The database's figures are there beside them, read at the same scrape.
    assert metrics.total("backplane_tasks") == 2


def test_the_launcher_empties_its_metrics_directory_and_names_it_to_its_children(tmp_path: Path) -> None:
    var_dir = tmp_path / "var"
    metrics_dir = var_dir / "metrics"
    metrics_dir.mkdir(parents=True)
    alive, dead = metrics_process_name(101), metrics_process_name(202)
    for name in (f"counter_{alive}.db", f"histogram_{alive}.db", f"gauge_livesum_{dead}.db", f"gauge_max_{dead}.db"):
        (metrics_dir / name).write_bytes(b"left by an earlier run")
    launcher = Launcher(host="127.0.0.1", port=8000, var_dir=var_dir)
    assert launcher.env["BACKPLANE_METRICS_DIR"] == str(metrics_dir)

    launcher.mark_metrics_dead(202)  # a live gauge of a dead process leaves the sums; counters stay
    assert sorted(path.name for path in metrics_dir.iterdir()) == [f"counter_{alive}.db", f"gauge_max_{dead}.db",
                                                                   f"histogram_{alive}.db"]
    launcher.empty_metrics_dir()
    assert list(metrics_dir.iterdir()) == []


def product_metrics(product: RunningProduct) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = httpx.get(product.url + "/metrics", timeout=10).text
    return {(sample.name, tuple(sorted(sample.labels.items()))): sample.value
            for family in text_string_to_metric_families(text) for sample in family.samples}


def counted_by(metrics_dir: Path) -> set[int]:
    """The pids of the processes of this host that wrote counters into ``metrics_dir``."""
    host = metrics_process_name(0).removesuffix("-0")
    return {int(path.stem.removeprefix(f"counter_{host}-")) for path in metrics_dir.glob(f"counter_{host}-*.db")}


@pytest.mark.slow
def test_under_make_run_the_web_process_reports_what_the_worker_counted() -> None:
    var_dir = new_var_dir("bp-metrics-")
    metrics_dir = var_dir / "metrics"
    metrics_dir.mkdir(parents=True)
    (metrics_dir / "counter_999999.db").write_bytes(b"left by an earlier run")
    # A queue bound to every topic, declared by the relay: a message no queue is bound for is
    # unroutable and never counted as delivered (docs/delivery.md).
    product = RunningProduct(var_dir, env={"BACKPLANE_OUTBOX_QUEUES": "metrics-test=#"})
    agent: ProductClient | None = None
    try:
        product.wait_ready()
        assert not (metrics_dir / "counter_999999.db").exists()
        agent = ProductClient(product, namespace="metrics")
        task_id = agent.create_task()
        for _ in range(3):
            agent.append(task_id)
        delivered = ("backplane_deliveries_total", (("destination", "broker"),))
        steps = ("backplane_events_appended_total", (("type", "ReasoningStepCompleted"),))

        # The web process appended; the worker's relay delivered the task's lifecycle message.
        # Neither number is the other process's, and one scrape of the web process has both.
        def worker_delivered() -> dict[tuple[str, tuple[tuple[str, str], ...]], float] | None:
            metrics = product_metrics(product)
            return metrics if metrics.get(delivered, 0) >= 1 else None

        metrics = wait_until(worker_delivered, timeout=60, what="the web process reports the worker's deliveries",
                             details=product.log)
        assert metrics[steps] == 3
        children = product.children()
        assert {children["web"], children["worker"]} <= counted_by(metrics_dir)

        worker = product.child("worker")
        worker.send_signal(signal.SIGKILL)
        product.child("worker", not_pid=worker.pid, timeout=60)
        # The dead worker's counts stay in the sums, beside its successor's.
        after = product_metrics(product)
        assert after[delivered] >= metrics[delivered] and after[steps] == 3
        assert worker.pid in counted_by(metrics_dir)
    finally:
        if agent is not None:
            agent.close()
        product.close()
        shutil.rmtree(var_dir.parent, ignore_errors=True)
