"""Benchmarks against real workers: `python -m bench.<name>`; results land in bench/results/."""
