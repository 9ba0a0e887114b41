"""`python -m fenced_cli`: the same command line as the `fenced` script."""

from fenced_cli import main

main()
