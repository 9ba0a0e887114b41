"""Example apps built on the public API."""
