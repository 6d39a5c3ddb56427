"""Data generators, each deterministic from a seed."""
