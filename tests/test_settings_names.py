"""A misspelt FENCED_* variable is warned about, never ignored silently; the list of names read outside
Settings stays true to the code that reads them."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

from fenced_core.settings import OTHER_NAMES, OTHER_PREFIXES, Settings, unknown_names

ROOT = Path(__file__).resolve().parent.parent
# The code that may read a FENCED_* variable (tests set their own: conftest's FENCED_TEST_* are prefixed).
CODE = [*ROOT.glob("*.py"), *ROOT.glob("*/*.py"), *ROOT.glob("*/*/*.py"), *ROOT.glob("scripts/*.sh"),
        ROOT / "docker" / "compose.yml", ROOT / ".ci" / "run"]
EXAMPLE_IN_DOCSTRINGS = {"FENCED_X"}  # `FENCED_X='value': what is accepted`, how an error line reads


def test_a_misspelt_name_is_reported_with_the_nearest_one():
    env = {"FENCED_LEASE_MS": "5", "FENCED_CONCURENCY": "3", "FENCED_ZZZ": "1", "PATH": "/bin"}
    assert unknown_names(env) == [
        "FENCED_CONCURENCY is not a fenced setting and is ignored (did you mean FENCED_CONCURRENCY?)",
        "FENCED_LEASE_MS is not a fenced setting and is ignored (did you mean FENCED_LEASE_TTL_MS?)",
        "FENCED_ZZZ is not a fenced setting and is ignored",
    ]


def test_every_name_that_is_read_is_known():
    env = {"FENCED_" + name.upper(): "1" for name in Settings.model_fields}
    env |= dict.fromkeys(OTHER_NAMES, "1") | {prefix + "ANYTHING": "1" for prefix in OTHER_PREFIXES}
    assert unknown_names(env) == []


def test_the_names_read_outside_settings_are_listed():
    """Every FENCED_* name the code, scripts and containers mention is a setting, listed, or prefixed as a
    script's or test's own; and every listed name is still read somewhere (the other settings classes
    included)."""
    from examples.shopping.settings import ShoppingSettings
    from fenced_api.live import LiveSettings

    mentioned: set[str] = set()
    for path in CODE:
        if ".venv" in path.parts or "tests" in path.parts or not path.is_file():
            continue
        mentioned |= set(re.findall(r"FENCED_[A-Z0-9_]*[A-Z0-9]\b", path.read_text(errors="replace")))
    known = {"FENCED_" + name.upper() for name in Settings.model_fields} | OTHER_NAMES | EXAMPLE_IN_DOCSTRINGS
    unlisted = sorted(n for n in mentioned if n not in known and not n.startswith(OTHER_PREFIXES))
    assert unlisted == [], f"read but neither a Settings field nor in OTHER_NAMES: {unlisted}"
    classes = {"FENCED_LIVE_" + f.upper() for f in LiveSettings.model_fields}
    classes |= {"FENCED_" + f.upper() for f in ShoppingSettings.model_fields}
    assert classes <= OTHER_NAMES, f"settings classes' names not listed: {sorted(classes - OTHER_NAMES)}"
    stale = sorted(OTHER_NAMES - mentioned - classes)
    assert stale == [], f"listed but read nowhere: {stale}"


def _env(**env: str) -> dict[str, str]:
    """This environment without its FENCED_* variables, and with `env`."""
    return {k: v for k, v in os.environ.items() if not k.startswith("FENCED_")} | env


def _run(args: list[str], **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, cwd=ROOT, env=_env(**env), capture_output=True, text=True, timeout=120)


def test_the_cli_warns_once_and_goes_on(tmp_path):
    out = _run([sys.executable, "-m", "fenced_cli", "runs"], FENCED_LEASE_MS="5",
               FENCED_DB_URL=f"sqlite:///{tmp_path}/none.db")
    warning = ("warning: FENCED_LEASE_MS is not a fenced setting and is ignored "
               "(did you mean FENCED_LEASE_TTL_MS?)")
    assert out.stderr.count(warning) == 1, out.stderr
    assert "no run store" in out.stderr, "the command went on after the warning"


def test_a_worker_process_warns_when_it_loads_celeryconfig_and_only_once():
    """celeryconfig warns (a worker's first import); a second caller in the process (the CLI's main, when a
    command loads the Celery app) does not repeat it."""
    once_more = "from fenced_core.settings import warn_unknown_names; warn_unknown_names()"
    out = _run([sys.executable, "-c", f"import celeryconfig; print(celeryconfig.broker_url); {once_more}"],
               FENCED_HEARTBEAT="5", FENCED_REDIS_URL="redis://127.0.0.1:1/0")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "redis://127.0.0.1:1/0"
    assert out.stderr.count("warning: FENCED_HEARTBEAT is not a fenced setting and is ignored (did you mean "
                            "FENCED_HEARTBEAT_MS?)") == 1, out.stderr


def test_a_url_of_several_hosts_is_shown_without_its_passwords():
    from fenced_core.settings import safe_url

    assert safe_url("redis://:secret@127.0.0.1:6379/0") == "redis://:***@127.0.0.1:6379/0"
    assert safe_url("redis+cluster://:pw@h1:7000,h2:7001") == "redis+cluster://:***@h1:7000,h2:7001"
    assert safe_url("redis+sentinel://u:pw@h1:1,h2:2/main/0") == "redis+sentinel://u:***@h1:1,h2:2/main/0"
    assert safe_url("sentinel://:a@h1:1;sentinel://:b@h2:2") == "sentinel://:***@h1:1;sentinel://:***@h2:2"
    assert safe_url("redis+cluster://h1:7000,h2:7001") == "redis+cluster://h1:7000,h2:7001"
    for unsure in ("redis+cluster://:p/w@h1:1,h2:2", "redis+cluster://:p@w@h1:1,h2:2"):
        assert safe_url(unsure) == "(unparsable url)", "a password the mask cannot be sure of is not shown"


def test_fenced_worker_warns_once(tmp_path):
    """`fenced worker` replaces itself with celery, whose celeryconfig warns: the CLI does not warn first."""
    env = _env(FENCED_LEASE_MS="5", FENCED_REDIS_URL="redis://127.0.0.1:1/0",
               FENCED_DB_URL=f"sqlite:///{tmp_path}/store.db")
    err = tmp_path / "stderr.txt"
    with err.open("w") as sink:
        proc = subprocess.Popen([sys.executable, "-m", "fenced_cli", "worker"], cwd=ROOT, env=env,
                                stdout=subprocess.DEVNULL, stderr=sink)
        try:
            deadline = time.monotonic() + 90
            # Celery is up once its consumer reports the broker it cannot reach (after celeryconfig loaded).
            while "Cannot connect to" not in err.read_text() and time.monotonic() < deadline:
                time.sleep(0.5)
        finally:
            proc.kill()
            proc.wait(timeout=30)
    stderr = err.read_text()
    assert "Cannot connect to" in stderr, stderr[-2000:]
    assert stderr.count("warning: FENCED_LEASE_MS is not a fenced setting") == 1, stderr[-2000:]
