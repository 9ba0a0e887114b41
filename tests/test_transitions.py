"""The run-row state machine: one table in checkpoints/runs.py, DESIGN's states, and nothing else writes state."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from checkpoints import runs
from checkpoints.db import in_txn
from checkpoints.schema import RUN_STATES, TERMINAL_STATES

ROOT = Path(__file__).resolve().parents[1]
DESIGN = ROOT.parent / "shared" / "DESIGN.md"
STATES_LINE = "`queued → running → (waiting ↔ queued) → done | failed | cancelled | dead`"
# The changes DESIGN names in words rather than in the states line, each with its section and phrase.
DOCUMENTED = {
    ("running", "running"): ("A delivery", "Claim: `epoch = epoch + 1, owner = me` as a compare-and-set"),
    ("queued", "cancelled"): ("States", "Cancel is itself a claim"),
    ("running", "cancelled"): ("States", "Cancel is itself a claim"),
    ("waiting", "cancelled"): ("States", "Cancel is itself a claim"),
    ("queued", "failed"): ("States", "`expired` for a run nobody claimed"),
    ("dead", "queued"): ("States", "so a replay can settle it"),
}


def _line_edges() -> set[tuple[str, str]]:
    """The changes the states line draws: queued -> running, running -> waiting -> queued (and round
    again), running -> each terminal state."""
    edges = {("queued", "running"), ("running", "waiting"), ("waiting", "queued")}
    terminals = STATES_LINE.strip("`").rsplit("→", 1)[1]
    edges |= {("running", t.strip()) for t in terminals.split("|")}
    return edges


def test_the_table_is_designs_state_machine() -> None:
    if DESIGN.exists():  # the shared design sits beside the checkout; a fresh clone has the copy above
        text = DESIGN.read_text()

        def section(title: str) -> str:
            return text.split(f"## {title}", 1)[1].split("\n## ", 1)[0]

        assert STATES_LINE in section("States"), "DESIGN's states line changed: update the table and this test"
        for title, phrase in DOCUMENTED.values():
            assert phrase in section(title), (title, phrase)
    named = set(re.findall(r"[a-z]+", STATES_LINE))
    assert named == set(RUN_STATES)
    assert {s for edge in runs.TRANSITIONS for s in edge} == set(RUN_STATES)
    assert set(runs.TRANSITIONS) == _line_edges() | set(DOCUMENTED)
    assert not [e for e in runs.TRANSITIONS if e[0] in TERMINAL_STATES and e != ("dead", "queued")], \
        "only a replay leaves a terminal state"


@pytest.mark.parametrize("expect,to", [("done", "running"), ("waiting", "done"), ("cancelled", "queued"),
                                       ("queued", "waiting"), ("failed", "queued")])
def test_an_illegal_change_is_refused_before_any_write(store: str, expect: str, to: str) -> None:
    run_id = runs.new_run_id()
    in_txn(runs.create_run_txn, run_id, "u1", "normal", "q", "test")
    with pytest.raises(runs.IllegalTransition, match=f"{expect} -> {to}"):
        in_txn(runs.change_state_txn, run_id, (expect,), to, at_epoch=0, what="test")
    assert runs.get_run(run_id).state == "queued"  # type: ignore[union-attr]


def test_a_change_is_conditional_on_the_state_and_the_epoch(store: str) -> None:
    run_id = runs.new_run_id()
    in_txn(runs.create_run_txn, run_id, "u1", "normal", "q", "test")
    assert in_txn(runs.change_state_txn, run_id, "queued", "cancelled", at_epoch=1, what="stale epoch") == 0
    assert in_txn(runs.change_state_txn, run_id, "waiting", "cancelled", at_epoch=0, what="wrong state") == 0
    assert runs.get_run(run_id).state == "queued"  # type: ignore[union-attr]
    assert in_txn(runs.change_state_txn, run_id, "queued", "cancelled", at_epoch=0, what="cancel", epoch=1) == 1
    run = runs.get_run(run_id)
    assert run is not None and (run.state, run.epoch) == ("cancelled", 1)


def test_a_holder_write_cannot_change_the_state(store: str) -> None:
    run_id = runs.new_run_id()
    in_txn(runs.create_run_txn, run_id, "u1", "normal", "q", "test")
    c = runs.claim(run_id, "w/1")
    assert c is not None
    with pytest.raises(runs.IllegalTransition):
        in_txn(runs.fenced_update_txn, run_id, c.epoch, "sneaky", state="done")
    assert runs.get_run(run_id).state == "running"  # type: ignore[union-attr]


def _state_writes(path: Path) -> list[str]:
    """Where `path` writes run_checkpoints.state: an UPDATE of the table whose values name `state` (or are
    passed as ** or a dict, which could), a `state=` passed to a fenced write, or UPDATE ... SET state in
    SQL text. Outside runs.py there must be none: every state change goes through the table."""
    tree = ast.parse(path.read_text(), str(path))
    names = {"run_checkpoints"} | {a.asname for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)
                                   for a in n.names if a.name == "run_checkpoints" and a.asname}
    table = "|".join(re.escape(n) for n in names)
    updates = re.compile(rf"(\b({table})\.update\(|update\(({table})\))")
    found = []
    for node in ast.walk(tree):
        where = f"{path.relative_to(ROOT)}:{getattr(node, 'lineno', 0)}"
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "values" \
                and updates.search(ast.unparse(node.func.value)):
            dynamic = [a for a in node.args if not (isinstance(a, ast.Dict) and all(
                isinstance(k, ast.Constant) and k.value != "state" for k in a.keys))]
            if dynamic or any(k.arg in ("state", None) for k in node.keywords):
                found.append(f"{where}: {ast.unparse(node)[:80]}")
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name | ast.Attribute) and \
                ast.unparse(node.func).endswith("fenced_update_txn") and any(k.arg == "state" for k in node.keywords):
            found.append(f"{where}: fenced_update_txn(state=...)")
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and \
                re.search(r"update\s+run_checkpoints\s+set\b.*\bstate\b", node.value, re.I | re.S):
            found.append(f"{where}: UPDATE run_checkpoints SET state in SQL text")
    return found


def test_no_module_but_runs_writes_the_run_state() -> None:
    packages = ("checkpoints", "fencing", "tasks", "routing", "fenced_agents", "fenced", "fenced_core", "fenced_cli",
                "fenced_api", "examples", "harness", "chaos", "bench")
    assert all((ROOT / pkg).is_dir() for pkg in packages), "a package listed here no longer exists"
    files = [p for pkg in packages for p in (ROOT / pkg).rglob("*.py")
             if p != ROOT / "checkpoints" / "runs.py" and "migrations" not in p.parts]
    assert len(files) > 30
    assert [w for p in files for w in _state_writes(p)] == []
    assert _state_writes(ROOT / "checkpoints" / "runs.py"), "the check sees runs.py's own state writes"
