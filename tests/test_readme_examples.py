"""The README's two "runs as pasted" examples (support.py, refund.py) run as pasted: copied byte for byte
out of the README into a directory outside the package, imported by a real worker (FENCED_IMPORTS), and
started with `python support.py` / `python refund.py` as the README says."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _example(name: str) -> str:
    """The README's fenced code block that starts with `# <name>`."""
    blocks = re.findall(r"```python\n(.*?)```", (ROOT / "README.md").read_text(), re.S)
    found = [b for b in blocks if b.startswith(f"# {name}\n")]
    assert len(found) == 1, f"the README has {len(found)} blocks starting with '# {name}'"
    return found[0]


def test_the_readme_examples_run_as_pasted(workers, tmp_path: Path) -> None:
    support, refund = _example("support.py"), _example("refund.py")
    assert len(support.splitlines()) < 40, "the README promises an agent in under 40 lines"
    (tmp_path / "support.py").write_text(support)
    (tmp_path / "refund.py").write_text(refund)
    path = os.pathsep.join([str(tmp_path), str(ROOT), os.environ.get("PYTHONPATH", "")])
    workers.start("w1", FENCED_IMPORTS="support,refund", PYTHONPATH=path)
    env = {**os.environ, "PYTHONPATH": path}

    def run(script: str) -> str:
        done = subprocess.run([sys.executable, script], cwd=tmp_path, env=env, capture_output=True, text=True,
                              timeout=120)
        assert done.returncode == 0, done.stderr[-2000:]
        return done.stdout

    out = run("support.py")
    assert "state='done'" in out and "answer='Refunded 1299 cents.'" in out and "model_calls=3" in out, out
    out = run("refund.py")
    assert re.search(r"^done \{'refund_id': 're_[0-9a-f]{8}', 'cents': 1299\}$", out.strip(), re.M), out
