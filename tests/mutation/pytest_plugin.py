"""Loaded into every pytest session mutmut starts (``make mutants``; docs/mutation-testing.md).

mutmut runs pytest in its own process to learn which tests reach which function, runs the clean
tests there too, then forks one child per mutant from that process. So every session after the
first inherits what the first one left behind, and this plugin keeps that sound:

- the var directory: ``tests/embedded_postgres_plugin.py`` gives each session a fresh one and
  removes it when the session ends, but Django reads its settings once per process, so every
  later session would use the first session's removed directory (the broker's folders, the
  metrics files). Each session uses the one directory ``tests/mutation/mutants.py`` made for
  the whole run instead;
- database connections: one left open by the first session would be inherited by every child,
  and the first child to close it would close it for all the others, so each session closes
  its connections when it ends.
"""

from __future__ import annotations

import os
from collections.abc import Generator

import pytest

RUN_VAR_DIR = "BACKPLANE_MUTATION_VAR_DIR"


# Not tryfirst: it runs inside the embedded PostgreSQL plugin's wrapper (tryfirst), after that
# one has set BACKPLANE_VAR_DIR and before pytest-django reads the settings.
@pytest.hookimpl(wrapper=True)
def pytest_load_initial_conftests(
    early_config: pytest.Config, parser: pytest.Parser, args: list[str]
) -> Generator[None, object, object]:
    if RUN_VAR_DIR not in os.environ:
        raise pytest.UsageError(f"{RUN_VAR_DIR} is unset: this plugin is for the sessions of `make mutants`")
    os.environ["BACKPLANE_VAR_DIR"] = os.environ[RUN_VAR_DIR]
    return (yield)


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    from django.db import connections

    connections.close_all()
