"""`make run`'s launcher, for real: it serves the admin with the printed login and /readyz, and
SIGTERM leaves none of its processes (the database included) behind.

The rest of its life, with its processes killed one by one, a second start on the same data
(the same login) and Ctrl-C, is in ``tests/backplane/runtime/test_supervision.py``.
"""

from __future__ import annotations

import re
import shutil
import signal

import httpx
import pytest

from backplane.runtime import embedded_db
from tests.backplane.runtime.product import RunningProduct, alive, new_var_dir
from tests.support.waiting import wait_until

pytestmark = pytest.mark.slow


def admin_login_works(base_url: str, username: str, password: str) -> bool:
    with httpx.Client(base_url=base_url, follow_redirects=False, timeout=10) as client:
        page = client.get("/admin/login/")
        match = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page.text)
        assert match, "the login page carries a CSRF token"
        token = match.group(1)
        response = client.post(
            "/admin/login/?next=/admin/",
            data={"csrfmiddlewaretoken": token, "username": username, "password": password, "next": "/admin/"},
            headers={"Referer": base_url + "/admin/login/"},
        )
        if response.status_code != 302:
            return False
        return client.get("/admin/").status_code == 200


def test_it_serves_the_admin_with_the_printed_login_and_stops_everything_on_sigterm() -> None:
    var_dir = new_var_dir("bp-launcher-")
    product = RunningProduct(var_dir)
    try:
        product.wait_ready()
        username, password = product.login()
        assert admin_login_works(product.url, username, password)
        assert not admin_login_works(product.url, username, password + "x")

        everything = product.processes()
        assert {"web", "worker", "beat", "database"} <= set(product.children())
        product.process.send_signal(signal.SIGTERM)
        assert product.process.wait(timeout=60) == 0, product.log()
        wait_until(lambda: not alive(everything), timeout=10, what="every process of the product is gone",
                   details=lambda: f"left: {alive(everything)}")
        assert not embedded_db.is_running(product.pgdata)
    finally:
        product.close()
        shutil.rmtree(var_dir.parent, ignore_errors=True)
