"""The one settings module. Everything configurable comes from the environment.

``BACKPLANE_ENV`` chooses the mode: ``production`` (the default, nothing secret is
defaulted), ``development`` (``make run``) or ``test`` (``make test``). Only the last
two may generate a secret key under ``var/`` or find the embedded database there.
"""

from __future__ import annotations

import importlib.util
import os
import re
import secrets
import sys
import tempfile
from datetime import timedelta
from pathlib import Path
from typing import Any

from backplane import __version__
from backplane.runtime.env import (
    ImproperlyConfiguredEnv,
    database_from_url,
    env_bool,
    env_float,
    env_int,
    env_list,
    env_networks,
    env_str,
)
from backplane.telemetry.process_files import metrics_process_files_install
from backplane.telemetry.tracing import INSTRUMENTATIONS

BASE_DIR = Path(__file__).resolve().parent.parent

BACKPLANE_ENV = env_str("BACKPLANE_ENV", "production")
if BACKPLANE_ENV not in {"production", "development", "test"}:
    raise ImproperlyConfiguredEnv(f"BACKPLANE_ENV={BACKPLANE_ENV!r} must be production, development or test")
IS_LOCAL = BACKPLANE_ENV in {"development", "test"}

VAR_DIR = Path(env_str("BACKPLANE_VAR_DIR", str(BASE_DIR / "var")))


def _local_secret_key() -> str:
    """Development only: a random key kept under var/ so sessions survive restarts."""
    VAR_DIR.mkdir(parents=True, exist_ok=True)
    path = VAR_DIR / "secret_key"
    if not path.exists():
        path.write_text(secrets.token_urlsafe(50))
        path.chmod(0o600)
    return path.read_text().strip()


SECRET_KEY = env_str("SECRET_KEY") if not IS_LOCAL else env_str("SECRET_KEY", "") or _local_secret_key()
DEBUG = env_bool("DEBUG", BACKPLANE_ENV == "development")
ALLOWED_HOSTS = env_list("ALLOWED_HOSTS", ["localhost", "127.0.0.1", "[::1]", "testserver"] if IS_LOCAL else [])
if not IS_LOCAL and not ALLOWED_HOSTS:
    raise ImproperlyConfiguredEnv("ALLOWED_HOSTS must be set in production")
CSRF_TRUSTED_ORIGINS = env_list("CSRF_TRUSTED_ORIGINS", [])

# --- HTTPS (production): ``manage.py check --deploy`` passes with these defaults -------------
# Development and tests run over plain http and turn all of it off. TLS usually ends at a
# proxy in front of the web process; it says the original request was HTTPS in a header,
# given here as "Header-Name: value" (e.g. "X-Forwarded-Proto: https"). Set it only when
# that proxy always sets the header and strips it from clients' requests, or anyone can
# claim HTTPS. Without it behind such a proxy, the redirect below would loop.
_proxy_ssl_header = env_str("BACKPLANE_SECURE_PROXY_SSL_HEADER", "")
if _proxy_ssl_header:
    _header, _colon, _value = (part.strip() for part in _proxy_ssl_header.partition(":"))
    if not _colon or not _header or not _value:
        raise ImproperlyConfiguredEnv(
            f"BACKPLANE_SECURE_PROXY_SSL_HEADER={_proxy_ssl_header!r} must be 'Header-Name: value'")
    SECURE_PROXY_SSL_HEADER = ("HTTP_" + _header.upper().replace("-", "_"), _value)
SECURE_SSL_REDIRECT = env_bool("BACKPLANE_SSL_REDIRECT", not IS_LOCAL)
# Probes from inside the deployment (compose's healthcheck, a load balancer) speak plain http;
# /healthz is answered before Django sees it (backplane/asgi.py).
# The API is exempt too, but not served: a plain-http API request gets the contract's JSON 403
# (api/middleware.py) instead of an HTML redirect its client would follow as a GET.
SECURE_REDIRECT_EXEMPT = [r"^readyz$", r"^readyz/traffic$", r"^api/"]
SECURE_HSTS_SECONDS = env_int("BACKPLANE_HSTS_SECONDS", 0 if IS_LOCAL else 365 * 24 * 3600, minimum=0)
SECURE_HSTS_INCLUDE_SUBDOMAINS = env_bool("BACKPLANE_HSTS_INCLUDE_SUBDOMAINS", True)
SECURE_HSTS_PRELOAD = env_bool("BACKPLANE_HSTS_PRELOAD", True)
SESSION_COOKIE_SECURE = env_bool("BACKPLANE_SECURE_COOKIES", not IS_LOCAL)
CSRF_COOKIE_SECURE = SESSION_COOKIE_SECURE

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django.contrib.postgres",
    "rest_framework",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "channels",
    # Login throttling for the dashboard's and the admin's login pages (below, "Logins").
    "axes",
    "backplane",
    "recovery",
    "dashboard",
    # The demo fleet sits above everything and nothing imports it (docs/demo.md). It runs under
    # `make run` and in the tests only; the production image does not hold it (.dockerignore).
    *(["demo"] if IS_LOCAL else []),
]

MIDDLEWARE = [
    # HTTP requests by view and status on /metrics, under django-prometheus' names for a fraction of
    # its middlewares' cost (backplane/telemetry/http.py). First: its latency covers the rest.
    "backplane.telemetry.http.RequestMetricsMiddleware",
    "django.middleware.security.SecurityMiddleware",
    # An agent's traceparent, for the events it writes while tracing is off (telemetry/tracing.py).
    "backplane.telemetry.tracing.TraceContextMiddleware",
    "api.middleware.ApiErrorMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    # While the database is known to be down, answer 503 at once instead of waiting for the pool.
    "backplane.runtime.database_gate.DatabaseGateMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    # Django's MessageMiddleware, its storage built only for requests that use it (lib/messages.py).
    "backplane.lib.messages.LazyMessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    # Last, as django-axes asks: it turns a login refused during a lockout into its 429 answer.
    "axes.middleware.AxesMiddleware",
]

ROOT_URLCONF = "backplane.urls"
WSGI_APPLICATION = "backplane.wsgi.application"
ASGI_APPLICATION = "backplane.asgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]


def _database_url() -> str:
    url = env_str("DATABASE_URL", "")
    if url:
        return url
    # make run writes the embedded server's address here when it starts it.
    embedded = VAR_DIR / "database_url"
    if IS_LOCAL and embedded.exists():
        return embedded.read_text().strip()
    raise ImproperlyConfiguredEnv(
        "DATABASE_URL must be set (or start the embedded PostgreSQL with `make run`)"
    )


# Two roles (docs/production.md): DATABASE_URL is the application's, which may insert events but
# not change them, alter tables or switch triggers off (backplane/runtime/db_roles.py); the
# optional MIGRATION_DATABASE_URL is the owner of the tables and is used by `manage.py migrate`
# alone (and by `manage.py cdc`, which makes the CDC relay's publication, slot and role), which then
# also lets the application's role log in with DATABASE_URL's password. Without it, migrate uses
# DATABASE_URL (one role for everything, as the test suite does).
BACKPLANE_DB_APP_ROLE = env_str("BACKPLANE_DB_APP_ROLE", "backplane_app")
BACKPLANE_DB_APP_LOGIN: dict[str, str] | None = None
_migration_url = env_str("MIGRATION_DATABASE_URL", "")
# Which URL is which with a pooler (docs/production.md, "PgBouncer"): BACKPLANE_DB_POOLER=transaction
# says DATABASE_URL goes through a PgBouncer in transaction pooling mode, where a client holds a
# server connection for one transaction only. Requests, tasks, beat and the relay use it as they
# are; what needs a session of its own uses DATABASE_DIRECT_URL, a direct connection to the same
# database: the channel layer (LISTEN, session advisory locks), and `manage.py migrate` and
# `manage.py cdc` (a replication slot) when MIGRATION_DATABASE_URL is unset.
BACKPLANE_DB_POOLER = env_str("BACKPLANE_DB_POOLER", "none")
_direct_url = env_str("DATABASE_DIRECT_URL", "")
if BACKPLANE_DB_POOLER not in {"none", "transaction"}:
    raise ImproperlyConfiguredEnv(f"BACKPLANE_DB_POOLER={BACKPLANE_DB_POOLER!r} must be none or transaction")
if BACKPLANE_DB_POOLER == "transaction" and not _direct_url:
    raise ImproperlyConfiguredEnv(
        "BACKPLANE_DB_POOLER=transaction needs DATABASE_DIRECT_URL, a connection to the same database that "
        "bypasses the pooler: the channel layer's LISTEN, migrations and the CDC slot need a session")
if _direct_url and BACKPLANE_DB_POOLER != "transaction":
    raise ImproperlyConfiguredEnv(
        "DATABASE_DIRECT_URL is set but BACKPLANE_DB_POOLER is not 'transaction': if DATABASE_URL goes through "
        "PgBouncer, say so (its connections must not prepare statements); if not, unset DATABASE_DIRECT_URL")
_app_database = database_from_url(_database_url())
_owner_command = Path(sys.argv[0]).name == "manage.py" and sys.argv[1:2] in (["migrate"], ["cdc"])
if _migration_url and _owner_command:
    if _app_database["USER"] != BACKPLANE_DB_APP_ROLE:
        raise ImproperlyConfiguredEnv(
            f"with MIGRATION_DATABASE_URL set, DATABASE_URL must log in as BACKPLANE_DB_APP_ROLE "
            f"({BACKPLANE_DB_APP_ROLE!r}), not {_app_database['USER']!r}")
    BACKPLANE_DB_APP_LOGIN = {"password": str(_app_database["PASSWORD"])}
    DATABASES = {"default": database_from_url(_migration_url)}
elif _direct_url and _owner_command:
    DATABASES = {"default": database_from_url(_direct_url)}
else:
    DATABASES = {"default": _app_database}
# Whether Django's default connections (and so the async pool's) go through the transaction pooler.
BACKPLANE_DB_THROUGH_POOLER = DATABASES["default"] is _app_database and BACKPLANE_DB_POOLER == "transaction"
DATABASES["default"]["CONN_MAX_AGE"] = env_int("BACKPLANE_CONN_MAX_AGE", 0, minimum=0)
DATABASES["default"]["CONN_HEALTH_CHECKS"] = True
DATABASES["default"]["TIME_ZONE"] = None
# Under ASGI every request may run on another thread, so Django's persistent connections
# do not help; psycopg's pool does (Django 5.1+). Off in tests, which manage connections.
# Seconds a request waits for a pooled connection, in Django's pool and in the async one. Short on
# purpose: with the database down the pool waits this long before giving up, and a caller must
# get its 503 within 2 s (backplane/runtime/database_gate.py answers the requests after that at once).
BACKPLANE_DB_POOL_TIMEOUT = env_float("BACKPLANE_DB_POOL_TIMEOUT", 1.0, minimum=0.1)
# Seconds a pool keeps retrying a connection that failed before it gives that attempt up, in both
# pools. psycopg_pool retries with a doubling delay (1, 2, 4, 8 s ...) and grows the pool by one
# attempt at a time, so after a database restart of a few seconds its next try could be 8 s or more
# away, every request meanwhile a 503 although the database is back. A short limit ends the
# attempt instead; the next request that needs a connection starts a fresh one at once, and while
# the database is still down the gate (runtime/database_gate.py) keeps requests off the pool.
BACKPLANE_DB_POOL_RECONNECT_TIMEOUT = env_float("BACKPLANE_DB_POOL_RECONNECT_TIMEOUT", 2.0, minimum=0.5)
if env_bool("BACKPLANE_DB_POOL", BACKPLANE_ENV != "test"):
    from backplane.runtime import pool_checks

    DATABASES["default"]["CONN_MAX_AGE"] = 0
    # The pool's check runs only on connections that sat idle (runtime/pool_checks.py; installed
    # by BackplaneConfig.ready), not before every request; ``reset`` notes when each came back.
    DATABASES["default"]["OPTIONS"]["pool"] = {
        "reset": pool_checks.note_returned,
        "min_size": env_int("BACKPLANE_DB_POOL_MIN", 2, minimum=0),
        "max_size": env_int("BACKPLANE_DB_POOL_MAX", 20, minimum=1),
        "timeout": BACKPLANE_DB_POOL_TIMEOUT,
        "reconnect_timeout": BACKPLANE_DB_POOL_RECONNECT_TIMEOUT,
    }
# The async pool of the agent routes the HTTP front serves on the event loop
# (backplane/runtime/async_pool.py): one per web process beside Django's.
BACKPLANE_ASYNC_DB_POOL_MAX = env_int("BACKPLANE_ASYNC_DB_POOL_MAX", 8, minimum=1)
# libpq's connect timeout (psycopg enforces at least 2 s): a database host that does not answer
# must not hold a request, a probe or a duty for the operating system's TCP timeout.
DATABASES["default"]["OPTIONS"].setdefault("connect_timeout", env_int("BACKPLANE_DB_CONNECT_TIMEOUT", 2, minimum=2))
# Django's connections bind parameters on the server and prepare a statement run five times on a
# connection (psycopg's threshold; Django's default binds on the client, which prepares nothing):
# planning each statement anew cost PostgreSQL about as much as running it (docs/benchmarks.md).
# Statements that take no parameters on the server (SET, DDL) pass values another way. The async
# pool takes the same threshold (async_pool.py builds its connections from these options).
DATABASES["default"]["OPTIONS"].update(server_side_binding=True, prepare_threshold=5)
if BACKPLANE_DB_THROUGH_POOLER:
    # Taken when DATABASE_URL goes through PgBouncer in transaction mode: PgBouncer 1.18 does not
    # follow named prepared statements, so a statement prepared on one server connection is missing,
    # or already there, on the next (tests/e2e/test_pgbouncer.py shows it). Parameters are still bound
    # on the server, through the unnamed statement. A `.iterator()` outside a transaction would hold a
    # cursor (WITH HOLD) on a server connection the client no longer owns: it reads on the client.
    DATABASES["default"]["OPTIONS"]["prepare_threshold"] = None
    DATABASES["default"]["DISABLE_SERVER_SIDE_CURSORS"] = True
# An optional streaming replica of DATABASE_URL's database for the dashboard's pages and the API's
# heavy lists; agents' routes and every write stay on the primary (backplane/runtime/replica.py
# says which reads go there, and when a lagging or unreachable replica is passed over).
_replica_url = env_str("DATABASE_REPLICA_URL", "")
BACKPLANE_REPLICA_MAX_LAG_SECONDS = env_float("BACKPLANE_REPLICA_MAX_LAG_SECONDS", 10.0, minimum=0.0)
if _replica_url:
    _replica = database_from_url(_replica_url)
    # The primary's pool and connect timeout, not its URL's libpq options: a target_session_attrs
    # of read-write would refuse every standby.
    _replica["OPTIONS"].setdefault("connect_timeout", DATABASES["default"]["OPTIONS"]["connect_timeout"])
    if "pool" in DATABASES["default"]["OPTIONS"]:  # a pool of its own, on the same terms
        _replica["OPTIONS"]["pool"] = dict(DATABASES["default"]["OPTIONS"]["pool"])
    _replica["CONN_MAX_AGE"] = DATABASES["default"]["CONN_MAX_AGE"]
    _replica["CONN_HEALTH_CHECKS"] = True
    _replica["TIME_ZONE"] = None
    # A test run reads the replica alias from the test database itself.
    _replica["TEST"] = {"MIRROR": "default"}
    DATABASES["replica"] = _replica
    DATABASE_ROUTERS = ["backplane.runtime.replica.ReplicaRouter"]
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
# Plotly's JavaScript is served from the installed ``plotly`` package (no CDN: the product
# runs offline), at static/vendor/plotly/plotly.min.js.
_plotly = importlib.util.find_spec("plotly")
assert _plotly is not None and _plotly.submodule_search_locations, "the plotly package is not installed"
STATICFILES_DIRS = [
    BASE_DIR / "static",
    ("vendor/plotly", Path(list(_plotly.submodule_search_locations)[0]) / "package_data"),
]
STATIC_ROOT = VAR_DIR / "staticfiles"
# Straight from the finders in development and tests, so no collectstatic step is needed.
WHITENOISE_USE_FINDERS = IS_LOCAL
WHITENOISE_AUTOREFRESH = DEBUG
if IS_LOCAL:
    STATIC_ROOT.mkdir(parents=True, exist_ok=True)

# The dashboard's own login page; the admin keeps its own at /admin/login/.
LOGIN_URL = "/login/"
LOGIN_REDIRECT_URL = "/"
LOGOUT_REDIRECT_URL = "/login/"

# --- Logins: django-axes counts failures on both login pages -----------------------------------
# After BACKPLANE_LOGIN_FAILURE_LIMIT failures for one username from one address, that pair's
# logins are refused (429), the right password included, for BACKPLANE_LOGIN_COOLOFF_SECONDS after
# the last failure; a success resets the count. The address is REMOTE_ADDR: behind a proxy, the
# proxy's, unless it passes the client's on (docs/production.md, "Roles"). ModelBackend after the
# check does the login itself; axes' check needs the request, which every login page passes.
AUTHENTICATION_BACKENDS = ["axes.backends.AxesStandaloneBackend", "django.contrib.auth.backends.ModelBackend"]
AXES_FAILURE_LIMIT = env_int("BACKPLANE_LOGIN_FAILURE_LIMIT", 5, minimum=1)
AXES_COOLOFF_TIME = timedelta(seconds=env_int("BACKPLANE_LOGIN_COOLOFF_SECONDS", 900, minimum=1))
AXES_LOCKOUT_PARAMETERS = [["username", "ip_address"]]
AXES_RESET_ON_SUCCESS = True
# Not in the admin, whose every action declares its permission (tests/backplane/test_admin_permissions.py):
# lift a lockout with `manage.py axes_reset_username` or `axes_reset`.
AXES_ENABLE_ADMIN = False

# --- Broker and Channels: embedded defaults, Redis when REDIS_URL is set ---------------------
REDIS_URL = env_str("REDIS_URL", "")
BROKER_DIR = VAR_DIR / "broker"

if REDIS_URL:
    CELERY_BROKER_URL = REDIS_URL
    CELERY_BROKER_TRANSPORT_OPTIONS: dict[str, object] = {}
    CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "channels_redis.core.RedisChannelLayer",
            "CONFIG": {"hosts": [REDIS_URL]},
        }
    }
else:
    # kombu's filesystem transport with atomic writes (backplane/delivery/kombu_filesystem.py).
    CELERY_BROKER_URL = "bpfilesystem://"
    for _folder in ("queue", "control", "processed"):
        (BROKER_DIR / _folder).mkdir(parents=True, exist_ok=True)
    CELERY_BROKER_TRANSPORT_OPTIONS = {
        # One folder for in and out: producers and consumers share the same queue files.
        "data_folder_in": str(BROKER_DIR / "queue"),
        "data_folder_out": str(BROKER_DIR / "queue"),
        "control_folder": str(BROKER_DIR / "control"),
        "processed_folder": str(BROKER_DIR / "processed"),
        "store_processed": False,
        # kombu polls a filesystem queue (1 s by default). Each poll lists one small folder,
        # so polling five times a second costs little and lets a beat tick (the stall
        # detector's 2 s) start within 0.2 s instead of up to 1 s later.
        "polling_interval": 0.2,
    }
    # channels_postgres builds its own connection from a Django-style dict and silently
    # comes back None without PASSWORD, TIME_ZONE and OPTIONS. It LISTENs, takes session advisory
    # locks and prepares every statement (channels_postgres/db.py): behind a pooler, the direct URL.
    _layer_db: dict[str, Any]
    if BACKPLANE_DB_POOLER == "transaction":
        _layer_db = dict(database_from_url(_direct_url))
        _layer_db["OPTIONS"].setdefault("connect_timeout", DATABASES["default"]["OPTIONS"]["connect_timeout"])
    else:
        _layer_db = dict(DATABASES["default"])
        # Django's options, not libpq's: the layer passes OPTIONS to libpq.
        _layer_db["OPTIONS"] = {k: v for k, v in DATABASES["default"]["OPTIONS"].items()
                                if k not in ("server_side_binding", "prepare_threshold")}
    _layer_db.setdefault("PASSWORD", "")
    _layer_db["TIME_ZONE"] = None
    # Its pool holds connections per process (web, each Celery child); a few are plenty.
    _layer_db["PSYCOPG_OPTIONS"] = {"min_size": 1, "max_size": 4}
    CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "channels_postgres.core.PostgresChannelLayer",
            "CONFIG": _layer_db,
        }
    }
    INSTALLED_APPS.append("channels_postgres")
    # Its group_discard goes through the ORM on a connection of this name (the same database;
    # in tests, the same test database).
    DATABASES["channels_postgres"] = {
        **DATABASES["default"],
        "OPTIONS": {k: v for k, v in DATABASES["default"]["OPTIONS"].items() if k != "pool"},
        "TEST": {"MIRROR": "default"},
    }

# --- The shared cache: what every web process must agree on (the API's rate limits) ----------
# Redis when REDIS_URL is set; otherwise a table in the database, created by the migration
# recovery/migrations/0004_cache_table.py, so `migrate` is all a new deployment needs.
if REDIS_URL:
    CACHES = {"default": {"BACKEND": "django.core.cache.backends.redis.RedisCache", "LOCATION": REDIS_URL}}
else:
    CACHES = {"default": {"BACKEND": "django.core.cache.backends.db.DatabaseCache", "LOCATION": "backplane_cache"}}

# Every event write announces itself to open dashboard pages after commit (dashboard/live.py).
BACKPLANE_LIVE_NOTICES = env_bool("BACKPLANE_LIVE_NOTICES", True)

# RabbitMQ (an amqp:// URL) or another kombu URL as the Celery broker instead of the one chosen
# above; the channel layer and the cache stay where REDIS_URL puts them.
BACKPLANE_BROKER_URL = env_str("BACKPLANE_BROKER_URL", "")
if BACKPLANE_BROKER_URL:
    CELERY_BROKER_URL = BACKPLANE_BROKER_URL
    CELERY_BROKER_TRANSPORT_OPTIONS = {}
if CELERY_BROKER_URL.startswith(("amqp://", "amqps://", "pyamqp://")):
    # An enqueue returns once RabbitMQ has confirmed the task, and the tasks' queue is a
    # durable quorum queue. A retry's countdown (autoretry's backoff) then travels through
    # Celery's native delayed delivery, which its worker declares by itself and which routes
    # only through a topic exchange (on a direct one the worker holds the task until its ETA).
    CELERY_BROKER_TRANSPORT_OPTIONS = {"confirm_publish": True}
    CELERY_TASK_DEFAULT_QUEUE_TYPE = "quorum"
    CELERY_TASK_DEFAULT_EXCHANGE_TYPE = "topic"

# Where the relay publishes outbox messages: a kombu URL, or kafka://host:port,… for Kafka
# (backplane/delivery/kafka_sink.py); by default the Celery broker.
BACKPLANE_OUTBOX_BROKER_URL = env_str("BACKPLANE_OUTBOX_BROKER_URL", "") or CELERY_BROKER_URL

# Threads, not prefork: a prefork child SIGKILLed while holding the pool's shared queue lock
# froze the worker for good (its main process alive, nothing running). The duties are database
# and network waits, so threads lose nothing; one that hangs is caught by the duty watchdog.
CELERY_WORKER_POOL = env_str("BACKPLANE_WORKER_POOL", "threads")
CELERY_WORKER_CONCURRENCY = env_int("BACKPLANE_WORKER_CONCURRENCY", 6, minimum=1)
CELERY_TASK_IGNORE_RESULT = True
# The worker logs through LOGGING like every other process (LOG_FORMAT=json included), instead
# of replacing the root logger's handlers with Celery's own.
CELERY_WORKER_HIJACK_ROOT_LOGGER = False
CELERY_TASK_ACKS_LATE = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
CELERY_BEAT_SCHEDULE_FILENAME = str(VAR_DIR / "celerybeat-schedule")
# Chain verification (backplane/integrity/verification.py): an incremental run checks what is new since the
# last one, a full run re-verifies every chain from seq 1; both walk the tasks in batches.
BACKPLANE_VERIFY_INCREMENTAL_SECONDS = env_int("BACKPLANE_VERIFY_INCREMENTAL_SECONDS", 60, minimum=1)
BACKPLANE_VERIFY_FULL_SECONDS = env_int("BACKPLANE_VERIFY_FULL_SECONDS", 6 * 3600, minimum=60)
BACKPLANE_VERIFY_BATCH_SIZE = env_int("BACKPLANE_VERIFY_BATCH_SIZE", 200, minimum=1, maximum=10000)
# Retention (recovery/retention.py): how often finished tasks that their namespace's retention rule
# has made due are pruned, once their events are exported (rules are set in the admin).
BACKPLANE_RETENTION_SECONDS = env_int("BACKPLANE_RETENTION_SECONDS", 60, minimum=1)
# How long a finished sandbox fork (a replay) is kept; the namespace's retention rules never
# prune sandboxes, and a source is kept while any fork of it is (recovery/retention.py).
BACKPLANE_SANDBOX_KEEP_SECONDS = env_int("BACKPLANE_SANDBOX_KEEP_SECONDS", 7 * 24 * 3600, minimum=1)
# Audit export (backplane/integrity/audit/export.py): each new sealed range, up to a signed tree head, becomes
# a segment (JSON Lines plus a signed manifest) in a directory, or in S3 with Object Lock in
# compliance mode when a bucket is named. S3 credentials come from the usual AWS environment.
BACKPLANE_AUDIT_EXPORT_SECONDS = env_int("BACKPLANE_AUDIT_EXPORT_SECONDS", 3600, minimum=60)
BACKPLANE_AUDIT_SEGMENT_MAX_EVENTS = env_int("BACKPLANE_AUDIT_SEGMENT_MAX_EVENTS", 100_000, minimum=1)
BACKPLANE_AUDIT_DIR = Path(env_str("BACKPLANE_AUDIT_DIR", str(VAR_DIR / "audit")))
# The price table's file (backplane/eventlog/costs.py): every migrate adds its rates that the
# table lacks (backplane/apps.py). Rates are edited in the admin after that.
BACKPLANE_PRICES_FILE = Path(env_str("BACKPLANE_PRICES_FILE", str(BASE_DIR / "backplane" / "eventlog" / "prices.json")))
BACKPLANE_AUDIT_S3_BUCKET = env_str("BACKPLANE_AUDIT_S3_BUCKET", "")
BACKPLANE_AUDIT_S3_PREFIX = env_str("BACKPLANE_AUDIT_S3_PREFIX", "backplane-audit/")
BACKPLANE_AUDIT_S3_ENDPOINT_URL = env_str("BACKPLANE_AUDIT_S3_ENDPOINT_URL", "")
BACKPLANE_AUDIT_S3_REGION = env_str("BACKPLANE_AUDIT_S3_REGION", "")
# Compliance-mode retention cannot be shortened or lifted by anyone, root account included.
BACKPLANE_AUDIT_S3_RETENTION_DAYS = env_int("BACKPLANE_AUDIT_S3_RETENTION_DAYS", 7 * 365, minimum=1)
# How often new events get leaf indices and a signed tree head (backplane/integrity/sealing.py).
BACKPLANE_SEAL_SECONDS = env_int("BACKPLANE_SEAL_SECONDS", 10, minimum=1)
# Bulk jobs (recovery/bulk.py): the largest frozen list a dry run accepts; how long a worker runs
# one job before it lets go and enqueues it again; how long its claim on the job lasts (a
# killed worker's job is resumed by another once it runs out, so it must outlast one chunk).
BACKPLANE_BULK_MAX_ITEMS = env_int("BACKPLANE_BULK_MAX_ITEMS", 200_000, minimum=1)
BACKPLANE_BULK_RUN_SECONDS = env_float("BACKPLANE_BULK_RUN_SECONDS", 20.0, minimum=0.1)
BACKPLANE_BULK_LEASE_SECONDS = env_int("BACKPLANE_BULK_LEASE_SECONDS", 60, minimum=2)

# The demo fleet that `make run` starts (docs/demo.md); the launcher reads BACKPLANE_DEMO itself.
BACKPLANE_DEMO_RATE = env_float("BACKPLANE_DEMO_RATE", 1.0, minimum=0.0)
BACKPLANE_DEMO_CRASH_RATE = env_float("BACKPLANE_DEMO_CRASH_RATE", 0.2, minimum=0.0)
BACKPLANE_DEMO_KEEP_SECONDS = env_int("BACKPLANE_DEMO_KEEP_SECONDS", 900, minimum=60)
CELERY_BEAT_SCHEDULE: dict[str, dict[str, object]] = {
    "purge-expired-tool-calls": {"task": "recovery.tasks.purge_expired_tool_calls", "schedule": 300.0},
    "detect-stalls": {"task": "recovery.tasks.detect_stalls", "schedule": 2.0, "options": {"expires": 10}},
    "seal-events": {"task": "backplane.tasks.seal_events", "schedule": float(BACKPLANE_SEAL_SECONDS),
                    "options": {"expires": 3 * BACKPLANE_SEAL_SECONDS}},
    "relay-outbox": {"task": "backplane.tasks.relay_outbox", "schedule": 1.0, "options": {"expires": 5}},
    "prune-delivered-outbox": {"task": "backplane.tasks.prune_delivered_outbox", "schedule": 600.0},
    # A run still queued when the next one is due is dropped rather than run twice.
    "verify-chains-incremental": {
        "task": "backplane.tasks.verify_chains_incremental",
        "schedule": float(BACKPLANE_VERIFY_INCREMENTAL_SECONDS),
        "options": {"expires": BACKPLANE_VERIFY_INCREMENTAL_SECONDS},
    },
    "verify-chains-full": {
        "task": "backplane.tasks.verify_chains_full",
        "schedule": float(BACKPLANE_VERIFY_FULL_SECONDS),
        "options": {"expires": BACKPLANE_VERIFY_FULL_SECONDS},
    },
    "audit-export": {
        "task": "backplane.tasks.audit_export",
        "schedule": float(BACKPLANE_AUDIT_EXPORT_SECONDS),
        "options": {"expires": BACKPLANE_AUDIT_EXPORT_SECONDS},
    },
    "prune-retained-tasks": {
        "task": "recovery.tasks.prune_retained_tasks",
        "schedule": float(BACKPLANE_RETENTION_SECONDS),
        "options": {"expires": BACKPLANE_RETENTION_SECONDS},
    },
    # Alert rules on saved searches (recovery/alerts.py): a run still queued after one interval is dropped.
    "evaluate-alerts": {"task": "recovery.tasks.evaluate_alerts", "schedule": 30.0, "options": {"expires": 30}},
    # Approval requests past their time (recovery/approvals.py): escalated or expired; waits for signals
    # past theirs (recovery/signals.py) ended. Every 5 s, so a waiting agent learns of it within seconds.
    "expire-approvals": {"task": "recovery.tasks.expire_approvals", "schedule": 5.0, "options": {"expires": 5}},
    # Bulk jobs (recovery/bulk.py): running jobs that no worker holds (a killed worker's lease ran
    # out) are enqueued again; a run still queued after one interval is dropped.
    "resume-bulk-jobs": {"task": "recovery.tasks.resume_bulk_jobs", "schedule": 5.0, "options": {"expires": 5}},
}
CELERY_TIMEZONE = "UTC"
# /readyz answers 503 when a periodic duty above has not succeeded for a few of its intervals
# (backplane/runtime/duties.py). Off in tests, where no beat runs unless a test starts one.
BACKPLANE_DUTY_WATCH = env_bool("BACKPLANE_DUTY_WATCH", BACKPLANE_ENV != "test")

# --- REST framework ------------------------------------------------------------------------
REST_FRAMEWORK = {
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "api.authentication.AgentTokenAuthentication",
        "api.authentication.StaffSessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    "DEFAULT_THROTTLE_CLASSES": ["api.authentication.PrincipalRateThrottle"],
    "DEFAULT_PARSER_CLASSES": ["api.parsers.StrictJSONParser"],
    "DEFAULT_RENDERER_CLASSES": ["rest_framework.renderers.JSONRenderer"],
    "EXCEPTION_HANDLER": "api.errors.api_exception_handler",
    "DATETIME_FORMAT": "%Y-%m-%dT%H:%M:%S.%fZ",
    "UNAUTHENTICATED_USER": None,
}
SPECTACULAR_SETTINGS = {
    "TITLE": "Agent Backplane API",
    "DESCRIPTION": "System of record and recovery controller for fleets of LLM agents.",
    "VERSION": __version__,
    "SERVE_INCLUDE_SCHEMA": False,
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    "COMPONENT_SPLIT_REQUEST": True,
    "POSTPROCESSING_HOOKS": [
        "drf_spectacular.hooks.postprocess_schema_enums",
        "api.schema.add_declared_bodies",
        "api.schema.forbid_unknown_request_fields",
        "api.schema.describe_parameters_and_link_operations",
    ],
}

# --- Backplane tunables --------------------------------------------------------------------
BACKPLANE_LEASE_SECONDS = env_int("BACKPLANE_LEASE_SECONDS", 30, minimum=1, maximum=3600)
BACKPLANE_MAX_ATTEMPTS = env_int("BACKPLANE_MAX_ATTEMPTS", 3, minimum=1, maximum=100)
BACKPLANE_PAYLOAD_LIMIT_BYTES = env_int("BACKPLANE_PAYLOAD_LIMIT_BYTES", 256 * 1024, minimum=1024)
BACKPLANE_BATCH_MAX_EVENTS = env_int("BACKPLANE_BATCH_MAX_EVENTS", 1000, minimum=1)
# Outbox delivery (docs/delivery.md). The retry schedule is every destination's default: the
# broker uses it and a webhook subscription may override each part. The delay after failed
# attempt n is drawn from [c/2, c], c = min(MAX, BASE * 2**(n-1)); with these defaults a message
# is retried for 25 to 51 hours before it becomes a dead letter (Svix ~27 h, Stripe up to 3 days).
BACKPLANE_OUTBOX_MAX_ATTEMPTS = env_int("BACKPLANE_OUTBOX_MAX_ATTEMPTS", 35, minimum=1)
BACKPLANE_OUTBOX_BACKOFF_BASE_SECONDS = env_int("BACKPLANE_OUTBOX_BACKOFF_BASE_SECONDS", 10, minimum=0)
BACKPLANE_OUTBOX_BACKOFF_MAX_SECONDS = env_int("BACKPLANE_OUTBOX_BACKOFF_MAX_SECONDS", 2 * 3600, minimum=1)
BACKPLANE_OUTBOX_RETENTION_SECONDS = env_int("BACKPLANE_OUTBOX_RETENTION_SECONDS", 24 * 3600, minimum=0)
BACKPLANE_OUTBOX_BATCH_SIZE = env_int("BACKPLANE_OUTBOX_BATCH_SIZE", 100, minimum=1)
BACKPLANE_OUTBOX_EXCHANGE = env_str("BACKPLANE_OUTBOX_EXCHANGE", "backplane")
# Broker messages: "strict" (a dead letter holds the later messages of its key until a reviewer
# decides it) or "best_effort" (it leaves the sequence). Webhooks: a field of each subscription.
BACKPLANE_OUTBOX_BROKER_ORDERING = env_str("BACKPLANE_OUTBOX_BROKER_ORDERING", "strict")
if BACKPLANE_OUTBOX_BROKER_ORDERING not in {"strict", "best_effort"}:
    raise ImproperlyConfiguredEnv(
        f"BACKPLANE_OUTBOX_BROKER_ORDERING={BACKPLANE_OUTBOX_BROKER_ORDERING!r} must be strict or best_effort")
# Publishes to the broker in flight at once per relay process, and the deadline of one publish.
BACKPLANE_OUTBOX_BROKER_CONCURRENCY = env_int("BACKPLANE_OUTBOX_BROKER_CONCURRENCY", 2, minimum=1, maximum=16)
BACKPLANE_OUTBOX_BROKER_TIMEOUT_SECONDS = env_int("BACKPLANE_OUTBOX_BROKER_TIMEOUT_SECONDS", 10, minimum=1)
# A claim's lease: rows a relay took and did not finish (it died) go to another relay after it.
BACKPLANE_OUTBOX_CLAIM_SECONDS = env_int("BACKPLANE_OUTBOX_CLAIM_SECONDS", 30, minimum=1)
# Threads per relay process (Celery worker or ``manage.py relay``) for all destinations together.
BACKPLANE_OUTBOX_RELAY_THREADS = env_int("BACKPLANE_OUTBOX_RELAY_THREADS", 8, minimum=2, maximum=64)
# Queues the product's own consumers read, declared and bound before anything is published (a
# message no queue is bound for is dropped by the broker): "queue=binding" pairs, comma-separated;
# name a queue twice for two bindings. External consumers declare their own (docs/delivery.md).
BACKPLANE_OUTBOX_QUEUES: list[tuple[str, str]] = []
for _binding in env_list("BACKPLANE_OUTBOX_QUEUES", []):
    _queue, _, _pattern = (part.strip() for part in _binding.partition("="))
    if not _queue or not _pattern:
        raise ImproperlyConfiguredEnv(f"BACKPLANE_OUTBOX_QUEUES: {_binding!r} is not queue=binding")
    BACKPLANE_OUTBOX_QUEUES.append((_queue, _pattern))
# The backplane's own topics (lifecycle, alerts, budgets, compensations: ``backplane.*``) go to the
# broker only where a route is declared: a binding of BACKPLANE_OUTBOX_QUEUES, or a pattern here for
# the queues external consumers declare themselves (e.g. "backplane.tasks.#"). Nobody asked for the
# others, and on a topic exchange they would only be unroutable: retried, then dead letters. The
# test suite routes them all by default, as its tests of those messages read them from the broker;
# tests/backplane/delivery/test_product_topics.py checks the default of an install.
BACKPLANE_OUTBOX_BROKER_TOPICS: list[str] = env_list("BACKPLANE_OUTBOX_BROKER_TOPICS",
                                                     ["backplane.#"] if BACKPLANE_ENV == "test" else [])
# Kafka, when BACKPLANE_OUTBOX_BROKER_URL is kafka://host:port,… (docs/delivery.md, "Kafka"): a
# message goes to the first Kafka topic here whose pattern matches its topic ("kafka_topic=pattern"
# pairs, comma-separated, AMQP patterns as the queues' bindings), else to BACKPLANE_OUTBOX_KAFKA_TOPIC.
_KAFKA_TOPIC_NAME = re.compile(r"^[A-Za-z0-9._-]{1,249}$")
BACKPLANE_OUTBOX_KAFKA_TOPIC = env_str("BACKPLANE_OUTBOX_KAFKA_TOPIC", "backplane.outbox")
BACKPLANE_OUTBOX_KAFKA_TOPICS: list[tuple[str, str]] = []
for _route in env_list("BACKPLANE_OUTBOX_KAFKA_TOPICS", []):
    _kafka_topic, _, _pattern = (part.strip() for part in _route.partition("="))
    if not _pattern or not _KAFKA_TOPIC_NAME.match(_kafka_topic):
        raise ImproperlyConfiguredEnv(f"BACKPLANE_OUTBOX_KAFKA_TOPICS: {_route!r} is not kafka_topic=pattern "
                                      "(a Kafka topic is 1 to 249 of A-Z a-z 0-9 . _ -)")
    BACKPLANE_OUTBOX_KAFKA_TOPICS.append((_kafka_topic, _pattern))
if not _KAFKA_TOPIC_NAME.match(BACKPLANE_OUTBOX_KAFKA_TOPIC):
    raise ImproperlyConfiguredEnv(f"BACKPLANE_OUTBOX_KAFKA_TOPIC={BACKPLANE_OUTBOX_KAFKA_TOPIC!r} is not a Kafka "
                                  "topic name (1 to 249 of A-Z a-z 0-9 . _ -)")
# How the outbox's broker messages reach Kafka (docs/delivery.md, "Change data capture"): "poll",
# the relay claims and publishes them; "cdc", Debezium reads them from the WAL through a
# publication and a replication slot (`manage.py cdc setup` makes both) and the relay only marks
# what it finds published. Webhooks are the relay's in both modes.
BACKPLANE_OUTBOX_RELAY_MODE = env_str("BACKPLANE_OUTBOX_RELAY_MODE", "poll")
if BACKPLANE_OUTBOX_RELAY_MODE not in ("poll", "cdc"):
    raise ImproperlyConfiguredEnv(f"BACKPLANE_OUTBOX_RELAY_MODE={BACKPLANE_OUTBOX_RELAY_MODE!r} is not poll or cdc")
if BACKPLANE_OUTBOX_RELAY_MODE == "cdc" and not BACKPLANE_OUTBOX_BROKER_URL.startswith("kafka://"):
    raise ImproperlyConfiguredEnv("BACKPLANE_OUTBOX_RELAY_MODE=cdc publishes to Kafka: BACKPLANE_OUTBOX_BROKER_URL "
                                  "must be a kafka:// URL")
_SQL_NAME = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")
BACKPLANE_CDC_SLOT = env_str("BACKPLANE_CDC_SLOT", "backplane_outbox")
BACKPLANE_CDC_PUBLICATION = env_str("BACKPLANE_CDC_PUBLICATION", "backplane_outbox")
# The role Debezium logs in as: REPLICATION and SELECT on the outbox table, nothing else.
BACKPLANE_CDC_ROLE = env_str("BACKPLANE_CDC_ROLE", "backplane_cdc")
BACKPLANE_CDC_PASSWORD = env_str("BACKPLANE_CDC_PASSWORD", "")
for _name, _value in (("BACKPLANE_CDC_SLOT", BACKPLANE_CDC_SLOT), ("BACKPLANE_CDC_PUBLICATION",
                      BACKPLANE_CDC_PUBLICATION), ("BACKPLANE_CDC_ROLE", BACKPLANE_CDC_ROLE)):
    if not _SQL_NAME.match(_value):
        raise ImproperlyConfiguredEnv(f"{_name}={_value!r} is not a lower-case SQL name (a-z 0-9 _)")
# /readyz turns red when the slot holds back more WAL than this (its consumer stopped or lags).
BACKPLANE_CDC_MAX_LAG_BYTES = env_int("BACKPLANE_CDC_MAX_LAG_BYTES", 256 * 1024 * 1024, minimum=1)
# The Kafka consumer group that reads back what Debezium published, to mark it delivered.
BACKPLANE_CDC_CONFIRM_GROUP = env_str("BACKPLANE_CDC_CONFIRM_GROUP", "backplane-cdc-confirm")
# The sealed event log as a stream (backplane/integrity/stream.py; docs/delivery.md, "The event log
# as a stream"): every sealed event to the Kafka topic PREFIX + its namespace, keyed by task id,
# in the seal's order (a task's in seq order), on the outbox's Kafka cluster.
BACKPLANE_EVENT_STREAM = env_bool("BACKPLANE_EVENT_STREAM", False)
BACKPLANE_EVENT_STREAM_TOPIC_PREFIX = env_str("BACKPLANE_EVENT_STREAM_TOPIC_PREFIX", "backplane.events.")
BACKPLANE_EVENT_STREAM_SECONDS = env_int("BACKPLANE_EVENT_STREAM_SECONDS", 1, minimum=1)
BACKPLANE_EVENT_STREAM_BATCH = env_int("BACKPLANE_EVENT_STREAM_BATCH", 1000, minimum=1, maximum=100_000)
if BACKPLANE_EVENT_STREAM and not BACKPLANE_OUTBOX_BROKER_URL.startswith("kafka://"):
    raise ImproperlyConfiguredEnv("BACKPLANE_EVENT_STREAM streams to the outbox's Kafka cluster: "
                                  "BACKPLANE_OUTBOX_BROKER_URL must be a kafka:// URL")
# A namespace is up to 100 of A-Z a-z 0-9 . _ - (NAMESPACE_VALIDATOR): any prefix of these
# characters up to 149 long makes a valid Kafka topic name with it.
if not re.match(r"^[A-Za-z0-9._-]{1,149}$", BACKPLANE_EVENT_STREAM_TOPIC_PREFIX):
    raise ImproperlyConfiguredEnv(f"BACKPLANE_EVENT_STREAM_TOPIC_PREFIX={BACKPLANE_EVENT_STREAM_TOPIC_PREFIX!r}: "
                                  "1 to 149 of A-Z a-z 0-9 . _ -")
if BACKPLANE_EVENT_STREAM:
    CELERY_BEAT_SCHEDULE["stream-events"] = {
        "task": "backplane.tasks.stream_events", "schedule": float(BACKPLANE_EVENT_STREAM_SECONDS),
        "options": {"expires": 5 * BACKPLANE_EVENT_STREAM_SECONDS}}
BACKPLANE_TOOL_CALL_TTL_SECONDS = env_int("BACKPLANE_TOOL_CALL_TTL_SECONDS", 24 * 3600, minimum=1)
BACKPLANE_NO_PROGRESS_FLAG_SECONDS = env_int("BACKPLANE_NO_PROGRESS_FLAG_SECONDS", 300, minimum=1)
BACKPLANE_NO_PROGRESS_STALL_SECONDS = env_int("BACKPLANE_NO_PROGRESS_STALL_SECONDS", 1800, minimum=1)
BACKPLANE_TOOL_CALL_TIMEOUT_SECONDS = env_int("BACKPLANE_TOOL_CALL_TIMEOUT_SECONDS", 300, minimum=1)
# Ed25519 seed (64 hex digits) that signs Merkle tree heads; development generates one under var/.
BACKPLANE_SIGNING_KEY = env_str("BACKPLANE_SIGNING_KEY", "")
# Key-encryption keys that wrap the data subjects' keys (backplane/privacy/keys.py, docs/privacy.md):
# the provider's class, and for the default one its JSON key file (development makes one under var/).
BACKPLANE_KEK_PROVIDER = env_str("BACKPLANE_KEK_PROVIDER", "backplane.privacy.keys.FileKeys")
BACKPLANE_KEK_FILE = env_str("BACKPLANE_KEK_FILE", str(VAR_DIR / "kek.json") if IS_LOCAL else "") or None
BACKPLANE_BREAKER_THRESHOLD = env_int("BACKPLANE_BREAKER_THRESHOLD", 3, minimum=1)
BACKPLANE_BREAKER_COOLDOWN_SECONDS = env_int("BACKPLANE_BREAKER_COOLDOWN_SECONDS", 60, minimum=1)
# The same breaker per registered tool (recovery/gateway.py): no usable answer counts a failure.
BACKPLANE_TOOL_BREAKER_THRESHOLD = env_int("BACKPLANE_TOOL_BREAKER_THRESHOLD", 3, minimum=1)
BACKPLANE_TOOL_BREAKER_COOLDOWN_SECONDS = env_int("BACKPLANE_TOOL_BREAKER_COOLDOWN_SECONDS", 30, minimum=1)
# Networks that webhook and tool calls may reach besides public addresses (comma-separated CIDRs;
# backplane/delivery/outbound.py). Private, loopback, link-local (the cloud metadata service) and
# other non-public addresses are refused otherwise. Development and tests allow loopback, where
# the demo's tools and the test suite's fake tools listen.
BACKPLANE_OUTBOUND_ALLOWED_NETWORKS = env_networks(
    "BACKPLANE_OUTBOUND_ALLOWED_NETWORKS", ["127.0.0.0/8", "::1/128"] if IS_LOCAL else [])
# Per agent token, DRF's "<count>/<s|m|h|d>" syntax.
BACKPLANE_RATE_LIMIT = env_str("BACKPLANE_RATE_LIMIT", "600/s")
# /metrics asks for "Authorization: Bearer <token>" when set; open when empty (backplane/metrics.py).
BACKPLANE_METRICS_TOKEN = env_str("BACKPLANE_METRICS_TOKEN", "")
# Without a token, /metrics answers only where told to be open: development and tests, or a
# production deployment that sets it because only its scraper can reach the port. Closed otherwise,
# since the figures name namespaces, kinds and agents.
BACKPLANE_METRICS_OPEN = env_bool("BACKPLANE_METRICS_OPEN", IS_LOCAL)
# --- Counters and histograms summed across processes (backplane/telemetry/counters.py) ------------
# prometheus_client's multiprocess mode: each process writes its values to files of its own in
# one directory and /metrics sums them. prometheus_client takes the directory from the
# environment when a metric is first made, which is after settings (nothing imports it before).
# Set here from BACKPLANE_METRICS_DIR, never inherited: a child started with another var dir (a
# second `make run`, a test's product) must not write into its parent's directory, which the
# launcher empties when it starts. Production defaults to a temporary directory of the user the
# processes run as: the image is built as root, and a directory the build made would not be
# writable by the user that runs it.
BACKPLANE_METRICS_DIR = Path(env_str(
    "BACKPLANE_METRICS_DIR",
    str(VAR_DIR / "metrics") if IS_LOCAL else str(Path(tempfile.gettempdir()) / f"backplane-metrics-{os.getuid()}")))
BACKPLANE_METRICS_DIR.mkdir(parents=True, exist_ok=True)
PROMETHEUS_MULTIPROC_DIR = os.environ["PROMETHEUS_MULTIPROC_DIR"] = str(BACKPLANE_METRICS_DIR)
# django-prometheus' setting, for the HTTP latency histogram (backplane/telemetry/http.py): its
# default starts at 10 ms, which every request here takes less than.
PROMETHEUS_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
                              float("inf"))
_prometheus_values = sys.modules.get("prometheus_client.values")
if _prometheus_values is not None and not getattr(_prometheus_values.ValueClass, "_multiprocess", False):
    raise ImproperlyConfiguredEnv("prometheus_client was imported before the settings: its counters would stay in "
                                  "one process, unseen by /metrics")
# Files named by host and pid, not pid alone: containers sharing the directory repeat pids.
metrics_process_files_install()
# Django refuses bodies above this before any view runs; keep it in step with the payload limit.
DATA_UPLOAD_MAX_MEMORY_SIZE = BACKPLANE_PAYLOAD_LIMIT_BYTES

# Traces (backplane/telemetry/tracing.py): on when an OpenTelemetry collector's OTLP/HTTP endpoint
# is given (http://collector:4318; spans go to <endpoint>/v1/traces), off and free otherwise. The
# exporter reads the other standard OTEL_EXPORTER_OTLP_* variables (headers, timeout) itself.
OTEL_EXPORTER_OTLP_ENDPOINT = env_str("OTEL_EXPORTER_OTLP_ENDPOINT", "").strip()
OTEL_SERVICE_NAME = env_str("OTEL_SERVICE_NAME", "agent-backplane")
# OpenTelemetry's own variable: instrumentations left off, by name (django, psycopg, celery,
# httpx). "psycopg" drops the statement spans, most of tracing's cost on an append.
OTEL_PYTHON_DISABLED_INSTRUMENTATIONS = env_list("OTEL_PYTHON_DISABLED_INSTRUMENTATIONS", [])
if not set(OTEL_PYTHON_DISABLED_INSTRUMENTATIONS) <= set(INSTRUMENTATIONS):
    raise ImproperlyConfiguredEnv(f"OTEL_PYTHON_DISABLED_INSTRUMENTATIONS={OTEL_PYTHON_DISABLED_INSTRUMENTATIONS!r}: "
                                  f"the names are {', '.join(INSTRUMENTATIONS)}")

# plain: the line people read in a terminal; json: one object a line with the trace and span
# ids, for a log pipeline (backplane/telemetry/logs.py).
LOG_FORMAT = env_str("LOG_FORMAT", "plain")
if LOG_FORMAT not in {"plain", "json"}:
    raise ImproperlyConfiguredEnv(f"LOG_FORMAT={LOG_FORMAT!r} must be plain or json")
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {
        "plain": {"format": "%(asctime)s %(levelname)s %(name)s %(message)s"},
        "json": {"()": "backplane.telemetry.logs.json_formatter"},
    },
    "filters": {"trace_ids": {"()": "backplane.telemetry.logs.TraceIdsFilter"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": LOG_FORMAT, "filters": ["trace_ids"]}},
    "root": {"handlers": ["console"], "level": env_str("LOG_LEVEL", "INFO")},
    # channels_postgres warns on every group_send to a group nobody has joined, which is
    # every live notice while no dashboard page is open.
    "loggers": {"channels_postgres.database": {"level": "ERROR"}, "channels_postgres.core": {"level": "ERROR"}},
}
