"""The `fenced` command line. Thin: each command parses, calls the runtime or the harness, prints.

The command modules register on one Typer app (fenced_cli.common.app); importing them here is what
makes `fenced --help` list them all."""

from fenced_cli import api, cards, chaos, epochs, explain, lifecycle, workers
from fenced_cli.common import app
from fenced_cli.main import main

__all__ = ["api", "app", "cards", "chaos", "epochs", "explain", "lifecycle", "main", "workers"]
