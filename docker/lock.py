"""Write docker/requirements.txt: fenced's runtime dependencies (no extras of its own), every one pinned
to the version installed in this environment, the one the tests ran on.

    .venv/bin/python docker/lock.py            # rewrite docker/requirements.txt
    .venv/bin/python docker/lock.py --check    # exit 1 if it is out of date (tests/test_docker.py)
"""

from __future__ import annotations

import re
import sys
from importlib.metadata import PackageNotFoundError, distribution
from pathlib import Path

from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

LOCK = Path(__file__).with_name("requirements.txt")
HEADER = "# fenced's runtime dependencies, pinned to the versions the tests ran on. Written by docker/lock.py.\n"


def closure(root: str = "fenced") -> dict[str, str]:
    """name -> installed version of every distribution `root` needs at run time (extras it names included)."""
    env = {k: str(v) for k, v in default_environment().items()}
    seen: dict[str, str] = {}
    todo: list[tuple[str, frozenset[str]]] = [(root, frozenset())]
    while todo:
        name, extras = todo.pop()
        try:
            dist = distribution(name)
        except PackageNotFoundError:
            continue  # a requirement for another platform or Python, not installed here
        key = canonicalize_name(dist.metadata["Name"])
        if key in seen and not extras:
            continue
        seen[key] = dist.version
        for line in dist.requires or []:
            req = Requirement(line)
            if req.marker and not any(req.marker.evaluate({**env, "extra": e}) for e in (extras or {""})):
                continue
            todo.append((req.name, frozenset(req.extras)))
    seen.pop("fenced", None)
    return dict(sorted(seen.items()))


def render() -> str:
    return HEADER + "".join(f"{name}=={version}\n" for name, version in closure().items())


def main(argv: list[str]) -> int:
    text = render()
    if "--check" in argv:
        if LOCK.read_text() != text:
            print(f"{LOCK} is out of date: run `.venv/bin/python docker/lock.py`", file=sys.stderr)
            return 1
        return 0
    LOCK.write_text(text)
    print(f"wrote {LOCK}: {len(re.findall(r'==', text))} pinned distributions")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
