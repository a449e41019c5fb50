# The two commands: `make run` starts the whole product, `make test` runs the whole suite.
# Both work on a fresh machine with only Python 3.11+: everything else is installed here.

PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: run test venv bench fuzz lint clean-db

run: $(STAMP)
	$(PY) -m backplane.runtime.launcher

test: $(STAMP)
	$(PY) -m pytest

venv: $(STAMP)

$(STAMP): requirements.txt
	@$(PYTHON) -c 'import sys; sys.exit("Python 3.11+ is required, found " + sys.version.split()[0]) if sys.version_info < (3, 11) else None'
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -r requirements.txt
	touch $(STAMP)

# Schemathesis against the API with fresh randomness and more examples than the suite's run.
fuzz: $(STAMP)
	BACKPLANE_FUZZ_RANDOM=1 BACKPLANE_FUZZ_EXAMPLES=300 $(PY) -m pytest tests/api/test_schemathesis.py

bench: $(STAMP)
	$(PY) bench/append.py

lint: $(STAMP)
	$(PY) -m ruff check .

# Stops a database left behind by a killed `make run` (a SIGKILLed owner leaves it running).
clean-db: $(STAMP)
	$(PY) -m backplane.runtime.embedded_db stop --pgdata var/pgdata
