"""`python -m fenced`: the same command line as the `fenced` script."""

from fenced.cli import main

main()
