"""YAML read safely, with libyaml's C parser where PyYAML has it (about ten times the
pure-Python parser's speed). The workflow reads its schemas and the published claims at
every Snakemake start, and a SLURM job starts Snakemake twice: the parser's time is paid
once per job. Both loaders build the same objects from the same text (safe tags only)."""

from __future__ import annotations

import yaml

LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def load(text: str):
    """``yaml.safe_load(text)``, with the C loader where available."""
    return yaml.load(text, Loader=LOADER)  # noqa: S506  a safe loader
