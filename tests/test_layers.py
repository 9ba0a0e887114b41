"""The house stays a house: arrows run down only (.importlinter) and no module imports itself in a circle; an
example app imports only the public API, and the CLI and HTTP API never import an app."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import grimp

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("fenced_cli", "bench", "chaos", "fenced_api", "harness", "examples", "fenced", "fenced_agents", "tasks",
            "routing", "fencing", "checkpoints", "fenced_core")


def test_every_import_runs_down_the_layers():
    lint_imports = Path(sys.executable).with_name("lint-imports")  # import-linter's command, beside python
    done = subprocess.run([str(lint_imports), "--config", str(ROOT / ".importlinter")], cwd=ROOT,
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert "3 kept, 0 broken" in done.stdout


def test_the_app_contracts_catch_an_app_reaching_into_the_runtime(tmp_path):
    """The forbidden contracts are live: a copy of the tree where the shopping app imports checkpoints and
    the API imports the app breaks both (and only those)."""
    import shutil

    for pkg in PACKAGES:
        shutil.copytree(ROOT / pkg, tmp_path / pkg, ignore=shutil.ignore_patterns("__pycache__", "static"))
    with (tmp_path / "examples" / "shopping" / "catalog.py").open("a") as f:
        f.write("\nfrom checkpoints import db  # noqa\n")
    with (tmp_path / "fenced_api" / "models.py").open("a") as f:
        f.write("\nfrom examples.shopping import cards  # noqa\n")
    lint_imports = Path(sys.executable).with_name("lint-imports")
    done = subprocess.run([str(lint_imports), "--config", str(ROOT / ".importlinter")], cwd=tmp_path,
                          capture_output=True, text=True, env={"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin"})
    assert done.returncode != 0
    assert "1 kept, 2 broken" in done.stdout, done.stdout[-3000:]
    assert "examples.shopping.catalog -> checkpoints" in done.stdout
    assert "fenced_api.models -> examples.shopping" in done.stdout


def import_cycles(graph: grimp.ImportGraph) -> list[list[str]]:
    """Strongly connected groups of more than one module (Tarjan), over run-time imports."""
    adj = {m: graph.find_modules_directly_imported_by(m) for m in graph.modules}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in adj[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                cycles.append(sorted(group))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10_000))
    for m in sorted(graph.modules):
        if m not in index:
            visit(m)
    return cycles


def test_no_import_cycles():
    graph = grimp.build_graph(*PACKAGES, exclude_type_checking_imports=True)
    assert import_cycles(graph) == []


def test_the_cycle_finder_finds_a_cycle():
    graph = grimp.ImportGraph()
    for m in ("a", "a.x", "a.y", "a.z"):
        graph.add_module(m)
    graph.add_import(importer="a.x", imported="a.y")
    graph.add_import(importer="a.y", imported="a.x")
    graph.add_import(importer="a.y", imported="a.z")
    assert import_cycles(graph) == [["a.x", "a.y"]]
