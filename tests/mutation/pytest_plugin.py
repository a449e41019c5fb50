"""Loaded into every pytest session mutmut starts (``make mutants``; docs/mutation-testing.md).

mutmut runs pytest in its own process to learn which tests reach which function, then forks
one child per mutant from that process. A database connection left open by the first session
would be inherited by every child, and the first child to close it would close it for all the
others: so each session closes its connections when it ends.
"""

from __future__ import annotations

import pytest


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    from django.db import connections

    connections.close_all()
