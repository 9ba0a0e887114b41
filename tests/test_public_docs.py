"""Every public name says what it guarantees under a crash and under a takeover (issue 12's docs rule).

The public names are what `fenced`, `fenced.models` and the optional adapters export in `__all__`; each
docstring (a Celery task's is its function's) must speak of a crash and of a takeover."""

from __future__ import annotations

import importlib
import inspect

import pytest

PUBLIC = ["fenced", "fenced.models", "fenced.pydantic_ai", "fenced.openai_agents"]


def _doc(obj: object) -> str:
    run = getattr(obj, "run", None)  # a Celery task (run_agent): the docstring is its function's
    doc = inspect.getdoc(run) if run is not None and getattr(obj, "name", None) else None
    return (doc or inspect.getdoc(obj) or "").lower()


def _names() -> list[tuple[str, str]]:
    out = []
    for module in PUBLIC:
        try:
            mod = importlib.import_module(module)
        except ImportError as exc:  # an optional extra that is not installed
            if module == "fenced" or "fenced" in (exc.name or ""):
                raise
            continue
        out += [(module, name) for name in mod.__all__]
    return out


@pytest.mark.parametrize(("module", "name"), _names())
def test_every_public_name_says_what_holds_under_a_crash_and_a_takeover(module: str, name: str) -> None:
    doc = _doc(getattr(importlib.import_module(module), name))
    assert doc, f"{module}.{name} has no docstring"
    missing = [what for what, words in (("a crash", ("crash",)), ("a takeover", ("takeover", "taken over")))
               if not any(w in doc for w in words)]
    assert not missing, f"{module}.{name}'s docstring does not say what holds under {' or '.join(missing)}"


def test_the_check_sees_the_whole_public_api() -> None:
    names = {n for m, n in _names() if m == "fenced"}
    assert {"Agent", "FencedTask", "step", "once", "effect", "tool", "Hooks", "run_agent"} <= names
