"""docs/operations.md stays true: every metric its alerts name is one the code exports, every setting it
tunes exists, every `fenced` command it tells an operator to run exists."""

from __future__ import annotations

import re

from typer.testing import CliRunner

from examples.shopping.settings import ShoppingSettings
from fenced_cli import app
from fenced_core.settings import Settings
from tests.conftest import ROOT

DOC = (ROOT / "docs" / "operations.md").read_text()


def _exported() -> set[str]:
    names: set[str] = set()
    for path in ("tasks/metrics.py", "fencing/metrics.py", "fenced_api/metrics.py"):
        for kind, name in re.findall(r'(\w+)\(\s*"(fenced_[a-z_]+)"', (ROOT / path).read_text()):
            names.add(name)
            if kind in ("Counter", "CounterMetricFamily"):
                names.add(f"{name}_total")
            if kind == "Histogram":
                names.update(f"{name}_{s}" for s in ("bucket", "count", "sum"))
    return names


def test_every_metric_the_runbook_names_is_exported() -> None:
    named = set(re.findall(r"\b(fenced_[a-z_]+)", DOC)) - {"fenced_api"}  # fenced_api/: the package
    assert len(named) >= 10
    assert sorted(named - _exported()) == []


def test_every_setting_and_command_the_runbook_names_exists() -> None:
    fields = [*Settings.model_fields, *ShoppingSettings.model_fields]  # the core's and the demo agent's
    settings = {f"FENCED_{name.upper()}" for name in fields}
    named = set(re.findall(r"\b(FENCED_[A-Z_]+[A-Z])\b", DOC))
    assert named and sorted(n for n in named if n not in settings and not n.endswith("_")) == []
    runner = CliRunner()
    for command in sorted(set(re.findall(r"`fenced ([a-z-]+)", DOC))):
        result = runner.invoke(app, [command, "--help"])
        assert result.exit_code == 0, (command, result.output)
