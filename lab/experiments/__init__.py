"""Experiment scripts: real-data runs whose numbers go into docs/RESULTS.md (not tests)."""
