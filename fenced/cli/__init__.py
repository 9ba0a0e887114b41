"""The `fenced` command line. Thin: each command parses, calls the runtime or the harness, prints.

The command modules register on one Typer app (fenced.cli.common.app); importing them here is what
makes `fenced --help` list them all."""

from fenced.cli import chaos, lifecycle
from fenced.cli.common import app
from fenced.cli.main import main

__all__ = ["app", "chaos", "lifecycle", "main"]
