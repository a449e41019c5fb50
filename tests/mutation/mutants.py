"""``make mutants``: mutation testing of the core invariants with mutmut (docs/mutation-testing.md).

What is mutated: the writer (``backplane/eventlog/writer.py``: lease checks, numbering, hashing,
the insert of events and outbox rows), the chain (``backplane/eventlog/chain.py``), the lease
service (``recovery/leases.py``) and the relay's claim (``outbox_claim`` and ``_claim_rows`` in
``backplane/delivery/relay.py``). Against a fast subset of the suite (``TESTS``), so that a run
finishes in minutes.

mutmut copies what it mutates into ``mutants/`` under its working directory and never touches
the checkout; the working directory is ``var/mutation/``, where this script links the project's
top-level parts and writes mutmut's ``setup.cfg`` (so no project file carries mutmut's config).
The tests run against one embedded PostgreSQL started here for the whole run (``--reuse-db``:
the test database is created once, not once per mutant), one mutant at a time (the machine is
shared). Prints each targeted function's killed/survived figures and every survivor; exits 0
whatever the score (the score is a report, not a gate), non-zero when mutmut's run fails.

    python -m tests.mutation.mutants                      # the run, then the report
    python -m tests.mutation.mutants --report             # the report of the last run only
    python -m tests.mutation.mutants "recovery.leases.*"  # only these mutants (fnmatch patterns)
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
WORK = ROOT / "var" / "mutation"

FILES = ["backplane/eventlog/writer.py", "backplane/eventlog/chain.py", "recovery/leases.py",
         "backplane/delivery/relay.py"]
# mutmut's mutant names are module.x_function__mutmut_N; the relay's claim part only.
MUTANTS = ["backplane.eventlog.writer.*", "backplane.eventlog.chain.*", "recovery.leases.*",
           "backplane.delivery.relay.x_outbox_claim__mutmut_*", "backplane.delivery.relay.x__claim_rows__mutmut_*"]
TESTS = [
    "tests/backplane/eventlog/test_event_append.py",
    "tests/backplane/eventlog/test_chain_verify.py",
    "tests/backplane/delivery/test_relay_claims.py",
    "tests/api/test_leases_api.py",
    "tests/backplane/test_promises.py",
]
# mutmut copies these into mutants/ and mutates FILES in its copy.
SOURCE_PATHS = ["backplane", "recovery"]
# What a test run reads besides Python packages: settings.py's BASE_DIR / "templates" and "static".
NON_PACKAGE_PARTS = ["templates", "static", "manage.py"]


def project_parts() -> list[str]:
    """The checkout's top-level parts a test run needs: every Python package (every app, the
    client, tests) and NON_PACKAGE_PARTS. Found, not listed, so that a new app cannot be left out."""
    packages = [path.name for path in ROOT.iterdir() if (path / "__init__.py").is_file()]
    return sorted(packages) + NON_PACKAGE_PARTS


LINKED = project_parts()
# Copied next to the mutated code (mutants/), which is the only copy of the project on the path
# (mutmut copies tests/ itself).
ALSO_COPY = [part for part in LINKED if part not in SOURCE_PATHS and part != "tests"]

SETUP_CFG = f"""[mutmut]
source_paths =
{chr(10).join("    " + path for path in SOURCE_PATHS)}
only_mutate =
{chr(10).join("    " + path for path in FILES)}
pytest_add_cli_args =
    -p
    tests.mutation.pytest_plugin
    --reuse-db
    -p
    no:cacheprovider
    -q
also_copy =
{chr(10).join("    " + path for path in ALSO_COPY)}
pytest_add_cli_args_test_selection =
{chr(10).join("    " + path for path in TESTS)}
use_git_change_detection = false
mutate_only_covered_lines = true
timeout_multiplier = 10.0
"""

# mutmut's exit codes of a mutant's test run (mutmut.__main__.status_by_exit_code).
STATUS = {1: "killed", 3: "killed", -24: "timeout", 24: "timeout", 0: "survived", 5: "no tests", 33: "no tests",
          34: "skipped", 35: "suspicious", 36: "timeout", 37: "caught by type check", 152: "timeout",
          255: "timeout", -11: "segfault", -9: "segfault"}


def prepare() -> None:
    if WORK.exists():
        shutil.rmtree(WORK)
    WORK.mkdir(parents=True)
    for name in LINKED:
        (WORK / name).symlink_to(ROOT / name)
    # A copy, not a link: mutmut reads its config from pyproject.toml first, and this one has none.
    # pytest's ``pythonpath = ["."]`` goes: it would put the unmutated project ahead of mutants/.
    pyproject = (ROOT / "pyproject.toml").read_text()
    (WORK / "pyproject.toml").write_text(
        "\n".join(line for line in pyproject.splitlines() if not line.startswith("pythonpath")) + "\n")
    (WORK / "setup.cfg").write_text(SETUP_CFG)


def run(patterns: list[str]) -> int:
    from backplane.runtime import embedded_db

    pgdata = WORK / "pgdata"
    env = dict(os.environ)
    # The run's var directory, for every pytest session of the run (tests/mutation/pytest_plugin.py).
    (WORK / "var").mkdir(exist_ok=True)
    env.update(BACKPLANE_ENV="test", BACKPLANE_MUTATION_VAR_DIR=str(WORK / "var"),
               DATABASE_URL=embedded_db.start(pgdata))
    mutmut = Path(sys.executable).with_name("mutmut")
    started = time.monotonic()
    try:
        code = subprocess.call([str(mutmut), "run", "--max-children", "1", *patterns], cwd=WORK, env=env)
    finally:
        embedded_db.destroy(pgdata)
    print(f"mutmut run exited {code} after {time.monotonic() - started:.0f} s")
    return code


def report(patterns: list[str]) -> None:
    by_function: dict[str, Counter[str]] = defaultdict(Counter)
    survivors: list[str] = []
    for path in FILES:
        meta = WORK / "mutants" / (path + ".meta")
        if not meta.exists():
            continue
        for name, code in json.loads(meta.read_text())["exit_code_by_key"].items():
            if code is None or not any(_matches(name, pattern) for pattern in patterns):
                continue
            status = STATUS.get(code, "suspicious")
            function = name.rsplit("__mutmut_", 1)[0]
            by_function[function][status] += 1
            if status not in ("killed", "timeout", "no tests"):
                survivors.append(f"{name}: {status}")
    total: Counter[str] = Counter()
    for function, counts in sorted(by_function.items()):
        total.update(counts)
        print(f"{function:70} " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())))
    killed = total["killed"] + total["timeout"]
    tested = killed + total["survived"] + total["suspicious"]
    print(f"\ntotal: {dict(total)}")
    if tested:
        print(f"kill rate (killed or timed out, of the mutants some test reaches): {killed}/{tested} = "
              f"{100 * killed / tested:.1f}%")
    if survivors:
        print("\nsurvivors (see each with: cd var/mutation && mutmut show NAME):")
        print("\n".join("  " + s for s in survivors))


def _matches(name: str, pattern: str) -> bool:
    import fnmatch

    return fnmatch.fnmatch(name, pattern)


def main() -> int:
    patterns = [arg for arg in sys.argv[1:] if not arg.startswith("--")] or MUTANTS
    code = 0
    if "--report" not in sys.argv:
        prepare()
        code = run(patterns)
    report(patterns)
    # A low score still exits 0; a run that mutmut could not finish does not.
    return code


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "backplane.settings")
    sys.exit(main())
