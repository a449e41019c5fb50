"""``make run`` under fire: one product, its processes killed one after another with SIGKILL.

Every kill is followed, with no person involved, by the product serving appends again and the
short-interval duties (relay-outbox, detect-stalls, seal-events) succeeding again within 30 s;
acknowledged writes are checked after each scenario. The tests run in file order on one
product (one start for the module); the last one kills the launcher itself and starts the
next one on the same var directory.
"""

from __future__ import annotations

import os
import shutil
import signal
import time
from collections.abc import Iterator

import psutil
import pytest

from backplane.runtime import embedded_db
from tests.backplane.runtime.product import (
    SHORT_DUTIES,
    ProductClient,
    RunningProduct,
    alive,
    new_var_dir,
    now,
    run_launcher,
)
from tests.support.waiting import wait_until

pytestmark = pytest.mark.slow

RECOVERY_SECONDS = 30.0


@pytest.fixture(scope="module")
def product() -> Iterator[RunningProduct]:
    var_dir = new_var_dir("bp-supervision-")
    running = RunningProduct(var_dir)
    try:
        running.wait_ready()
        yield running
    finally:
        running.close()
        # The last test replaces the module's product with the next launcher; stop that one too.
        following = getattr(running, "following", None)
        if following is not None:
            following.close()
        shutil.rmtree(var_dir.parent, ignore_errors=True)


@pytest.fixture(scope="module")
def client(product: RunningProduct) -> Iterator[ProductClient]:
    agent = ProductClient(product)
    agent.create_task()
    yield agent
    agent.close()


def test_a_second_launcher_refuses_and_leaves_the_first_alone(product: RunningProduct, client: ProductClient) -> None:
    postmaster = product.postmaster_pid()
    children = product.children()

    second = run_launcher(product.var_dir, port=product.port)
    assert second.returncode != 0
    assert "already running" in second.stderr and str(product.process.pid) in second.stderr, second.stderr

    # `make clean-db` refuses too, and stops nothing.
    clean = run_launcher(product.var_dir, "--clean")
    assert clean.returncode != 0
    assert "already running" in clean.stderr, clean.stderr

    assert postmaster is not None and product.postmaster_pid() == postmaster
    assert product.children() == children
    client.wait_recovered(now(), duties=("relay-outbox",))


def test_a_web_port_taken_by_another_program_is_reported_before_anything_starts(product: RunningProduct) -> None:
    other_var_dir = new_var_dir("bp-supervision-port-")
    try:
        refused = run_launcher(other_var_dir, port=product.port)
        assert refused.returncode != 0
        assert f"port {product.port}" in refused.stderr and "in use" in refused.stderr, refused.stderr
        assert not (other_var_dir / "pgdata").exists()  # no database was started for it
    finally:
        shutil.rmtree(other_var_dir.parent, ignore_errors=True)


def test_a_killed_web_process_comes_back(product: RunningProduct, client: ProductClient) -> None:
    web = product.child("web")
    since = now()
    web.kill()
    took = client.wait_recovered(since, timeout=RECOVERY_SECONDS)
    assert product.child("web").pid != web.pid
    assert f"web (pid {web.pid}) killed by SIGKILL" in product.log(), product.log()
    client.check_acknowledged_writes()
    print(f"web back and duties ran within {took:.1f} s")


def test_a_killed_beat_comes_back(product: RunningProduct, client: ProductClient) -> None:
    beat = product.child("beat")
    since = now()
    beat.kill()
    took = client.wait_recovered(since, timeout=RECOVERY_SECONDS)
    assert product.child("beat").pid != beat.pid
    client.check_acknowledged_writes()
    print(f"beat back and duties ran within {took:.1f} s")


def test_a_killed_postmaster_is_started_again_on_the_same_socket(product: RunningProduct,
                                                                 client: ProductClient) -> None:
    url = product.database_url()
    postmaster = product.postmaster_pid()
    assert postmaster is not None
    since = now()
    os.kill(postmaster, signal.SIGKILL)
    took = client.wait_recovered(since, timeout=RECOVERY_SECONDS)
    assert product.postmaster_pid() not in (None, postmaster)
    assert product.database_url() == url
    client.check_acknowledged_writes()
    print(f"database back and duties ran within {took:.1f} s")


def test_a_worker_killed_twenty_times_in_a_row_keeps_coming_back(product: RunningProduct,
                                                                   client: ProductClient) -> None:
    # After each kill: an append acknowledged and the two duties that run every 1-2 s ran again
    # (the new worker works), then the next kill. seal-events runs every 10 s, one run per
    # beat tick, so twenty fresh seal runs alone would take over 200 s; it must run again
    # after the last kill, like the others.
    killed = None
    took = []
    for _ in range(20):
        worker = product.child("worker", not_pid=killed)
        # The thread pool (settings.CELERY_WORKER_POOL) has no pool processes: the worker's
        # main process is the whole worker, and it is what gets killed.
        assert worker.children() == [], worker.children()
        since = now()
        worker.kill()
        killed = worker.pid
        took.append(client.wait_recovered(since, duties=("relay-outbox", "detect-stalls"), timeout=RECOVERY_SECONDS))
    client.wait_recovered(since, duties=SHORT_DUTIES, timeout=RECOVERY_SECONDS)
    client.check_acknowledged_writes()
    print(f"worker back after each of 20 kills within {max(took):.1f} s (mean {sum(took) / len(took):.1f} s)")


def test_a_wedged_worker_is_restarted_by_the_duty_watchdog(product: RunningProduct, client: ProductClient) -> None:
    # SIGSTOP: the worker's process stays alive and runs nothing, and it cannot act on SIGTERM,
    # like a worker wedged on a lock. Only the duties going overdue can tell.
    worker = product.child("worker")
    worker.suspend()
    try:
        wait_until(lambda: worker.status() == psutil.STATUS_STOPPED, timeout=5, what="the worker is stopped")
        since = now()
        took = client.wait_recovered(since, timeout=60)
        assert not alive([worker])
        assert product.child("worker").pid != worker.pid
        assert "duties overdue although the worker and beat have run for" in product.log(), product.log()
    finally:
        if alive([worker]):
            worker.kill()
    client.check_acknowledged_writes()
    print(f"wedged worker replaced and duties ran within {took:.1f} s")


def test_a_killed_launcher_leaves_nothing_running_and_the_next_one_starts_cleanly(
    product: RunningProduct, client: ProductClient,
) -> None:
    everything = product.processes()
    assert {"web", "worker", "beat", "database"} <= set(product.children())
    assert any(p.pid == product.postmaster_pid() for p in everything)

    product.kill()
    started = time.monotonic()
    gone = wait_until(lambda: not alive(everything), timeout=5, what="every process of the product is gone",
                      interval=0.05, details=lambda: f"left: {alive(everything)}\n{product.log()}")
    assert gone
    assert not embedded_db.is_running(product.pgdata)
    print(f"nothing left {time.monotonic() - started:.1f} s after the launcher's SIGKILL")

    # The next start, on the same var directory and port, cleans up after the killed one.
    following = RunningProduct(product.var_dir, port=product.port)
    product.following = following  # type: ignore[attr-defined]  # the fixture stops it
    following.wait_ready()
    assert following.login() == product.login()  # the same data, the same admin login
    client.product = following
    client.wait_recovered(now(), timeout=RECOVERY_SECONDS)
    client.check_acknowledged_writes()

    # ...and Ctrl-C stops all of it, the database last.
    everything = following.processes()
    following.process.send_signal(signal.SIGINT)
    assert following.process.wait(timeout=60) == 0, following.log()
    wait_until(lambda: not alive(everything), timeout=10, what="every process of the product is gone",
               details=lambda: f"left: {alive(everything)}")
    assert not embedded_db.is_running(following.pgdata)
    log = following.log()
    assert log.index("stopped web") < log.index("stopped beat") < log.index("stopped worker") \
        < log.index("stopped database"), log
