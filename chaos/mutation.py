"""Shows the suite catches a broken build: workers run from a copy whose checkpoint write lost its epoch.

The mutation lives only here and in a temporary copy of the tree; nothing that ships has a switch for it.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from fenced.workers import REPO_ROOT

TARGET = "checkpoints/runs.py"
FENCED = '_rc.epoch == sa.bindparam("w_epoch"), _rc.state == "running",\n    ).values({c:'  # _fenced_update
UNFENCED = '_rc.state == "running",\n    ).values({c:'


def mutated_copy(dest: Path) -> Path:
    """Copy the tracked tree to `dest` and drop the epoch condition from the fenced checkpoint write."""
    files = subprocess.run(["git", "ls-files"], cwd=REPO_ROOT, check=True, capture_output=True,
                           text=True).stdout.split()
    for rel in files:
        src = REPO_ROOT / rel
        if src.is_file():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel)
    target = dest / TARGET
    source = target.read_text()
    if source.count(FENCED) != 1:
        raise RuntimeError(f"mutation point not found exactly once in {TARGET}; update chaos/mutation.py")
    target.write_text(source.replace(FENCED, UNFENCED))
    return dest
