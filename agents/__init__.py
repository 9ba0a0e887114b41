"""The agent layer: agents from a model and plain functions, on the step runner's programs."""
