"""Published numbers vs reproduced ones.

``config/published.yaml`` holds, per paper, a list of claims::

    heroes:
      - id: rho_reverse
        claim: "Spearman rho(G, C), reversal, mean over kept seeds"
        source: "arXiv 2602.01442 v3, Sec. 4"
        value: 0.72
        tolerance: 0.08        # absolute; the paper's own spread where it gives one
        kind: number           # number (default) | text (a qualitative claim)

``compare`` turns those claims and a dict of measured values into the regression table
(claim, published, reproduced, tolerance, status, note). A measured value is a number,
or ``NotRun("reason")`` when the experiment could not run here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import yaml

STATUSES = ("reproduced", "differs", "not run")
COLUMNS = ["paper", "id", "claim", "published", "reproduced", "tolerance", "status", "note", "source"]


@dataclass
class NotRun:
    reason: str


@dataclass
class Holds:
    """A qualitative claim's verdict: ``holds`` True/False, with the measured evidence."""

    holds: bool
    evidence: str


def load_claims(path: str | Path, paper: str) -> list[dict]:
    data = yaml.safe_load(Path(path).read_text())
    if not isinstance(data, dict) or paper not in data:
        raise ValueError(f"{path} has no section {paper!r}")
    claims = data[paper] or []
    seen = set()
    for c in claims:
        for key in ("id", "claim", "source"):
            if key not in c:
                raise ValueError(f"{path}: a claim of {paper!r} lacks {key!r}: {c}")
        if c["id"] in seen:
            raise ValueError(f"{path}: duplicate claim id {c['id']!r} in {paper!r}")
        seen.add(c["id"])
        if c.get("kind", "number") == "number" and not isinstance(c.get("value"), (int, float)):
            raise ValueError(f"{path}: numeric claim {c['id']!r} needs a number 'value'")
    return claims


def status_of(published: float, reproduced: float, tolerance: float) -> str:
    if reproduced is None or (isinstance(reproduced, float) and math.isnan(reproduced)):
        return "not run"
    return "reproduced" if abs(reproduced - published) <= tolerance + 1e-12 else "differs"


def compare(paper: str, claims: list[dict], measured: dict) -> pd.DataFrame:
    """The regression table for one paper. Claims missing from ``measured`` are 'not run'."""
    rows = []
    for c in claims:
        m = measured.get(c["id"], NotRun("no rule measures this claim yet"))
        row = {
            "paper": paper,
            "id": c["id"],
            "claim": c["claim"],
            "published": c.get("value", c.get("text", "")),
            "tolerance": c.get("tolerance", ""),
            "source": c["source"],
            "reproduced": "",
            "note": "",
        }
        if isinstance(m, NotRun):
            row.update(status="not run", note=m.reason)
        elif isinstance(m, Holds):
            row.update(
                reproduced="holds" if m.holds else "does not hold",
                status="reproduced" if m.holds else "differs",
                note=m.evidence,
            )
        else:
            value, note = (m if isinstance(m, tuple) else (m, ""))
            value = float(value)
            row.update(
                reproduced=round(value, 4),
                status=status_of(float(c["value"]), value, float(c.get("tolerance", 0.0))),
                note=note,
            )
        rows.append(row)
    return pd.DataFrame(rows, columns=COLUMNS)
