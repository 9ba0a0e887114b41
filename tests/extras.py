"""Optional extras in tests: skipped where the extra is not installed, required where the suite must run
them (scripts/test.sh sets FENCED_REQUIRE_EXTRAS=1, so CI fails instead of skipping)."""

from __future__ import annotations

import importlib
import os
from types import ModuleType

import pytest


def require_extra(module: str) -> ModuleType:
    """`module` imported; a skip without it, unless FENCED_REQUIRE_EXTRAS=1 (then the ImportError fails)."""
    if os.environ.get("FENCED_REQUIRE_EXTRAS") == "1":
        return importlib.import_module(module)
    return pytest.importorskip(module)
