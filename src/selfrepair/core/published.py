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
(claim, published, reproduced, ci_low, ci_high, tolerance, status, note). A measured
value is a number, a ``(number, note)`` pair, ``Measured(value, lo, hi, note)`` when the
measurement has a confidence interval, ``Holds(...)`` for a qualitative claim, or
``NotRun("reason")`` when the experiment could not run here.

Status: a value without a CI is 'reproduced' within the tolerance band [published -
tolerance, published + tolerance], else 'differs'. With a CI the verdict is the CI's:
'reproduced' when the CI lies inside the band, 'differs' when it lies outside, and
'fragile' when it overlaps both (the verdict would change within the CI, i.e. it hangs
on the sample). Strict mode fails on 'differs' only and lists 'fragile' claims.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import yaml

from selfrepair.core import yaml_text

# "new": a finding of this workflow that no paper states (the ground-truth part), no published value
STATUSES = ("reproduced", "differs", "fragile", "not run", "new")
COLUMNS = [
    "paper",
    "id",
    "claim",
    "published",
    "reproduced",
    "ci_low",
    "ci_high",
    "tolerance",
    "status",
    "note",
    "source",
]


@dataclass
class NotRun:
    reason: str


@dataclass
class Measured:
    """A measured value with its confidence interval [lo, hi] (NaN bounds: no CI)."""

    value: float
    lo: float = float("nan")
    hi: float = float("nan")
    note: str = ""


@dataclass
class Holds:
    """A qualitative claim's verdict: ``holds`` True/False, with the measured evidence."""

    holds: bool
    evidence: str


KINDS = ("number", "text")


def claim_problems(claim, paper: str) -> list[str]:
    """What is wrong with one claim of ``paper`` (empty: nothing): it lacks its id, claim
    or source; a number claim lacks a finite number ``value`` or a finite ``tolerance`` >= 0
    (a missing tolerance would silently mean 0); a text claim lacks its ``text``."""
    if not isinstance(claim, dict):
        return [f"a claim of {paper!r} is not a mapping: {claim!r}"]
    out = [f"a claim of {paper!r} lacks {k!r}: {claim}" for k in ("id", "claim", "source") if k not in claim]
    name, kind = claim.get("id"), claim.get("kind", "number")
    if kind == "number":
        for key in ("value", "tolerance"):
            x = claim.get(key)
            if isinstance(x, bool) or not isinstance(x, (int, float)):
                got = f"not {x!r}" if key in claim else "it has none"
                out.append(f"numeric claim {name!r} of {paper!r} needs a number {key!r} ({got})")
            elif not math.isfinite(x):
                out.append(f"numeric claim {name!r} of {paper!r}: {key} {x} is not a finite number")
            elif key == "tolerance" and x < 0:
                out.append(f"numeric claim {name!r} of {paper!r}: tolerance {x} is negative")
    elif kind == "text":
        if not isinstance(claim.get("text"), str) or not claim["text"].strip():
            out.append(f"text claim {name!r} of {paper!r} needs its 'text'")
    else:
        out.append(f"claim {name!r} of {paper!r}: kind {kind!r} is not one of {', '.join(KINDS)}")
    return out


def _section_problems(claims, paper: str) -> list[str]:
    if claims is None:
        return []
    if not isinstance(claims, list):
        return [f"section {paper!r} is not a list of claims"]
    out, ids = [], [c.get("id") for c in claims if isinstance(c, dict) and "id" in c]
    for c in claims:
        out += claim_problems(c, paper)
    out += [f"duplicate claim id {i!r} in {paper!r}" for i in sorted({i for i in ids if ids.count(i) > 1}, key=str)]
    return out


def file_problems(path: str | Path) -> list[str]:
    """Every problem of the claims file ``path``, each naming the paper and claim id (empty:
    well formed). The workflow calls it at parse time (workflow/rules/common.smk), so that
    a claim without its number stops the run before any job starts."""
    try:
        data = yaml_text.load(Path(path).read_text())
    except yaml.YAMLError as e:
        return [f"not valid YAML: {e}"]
    if not isinstance(data, dict):
        return ["not a mapping of paper -> list of claims"]
    return [p for paper, claims in data.items() for p in _section_problems(claims, paper)]


def load_claims(path: str | Path, paper: str) -> list[dict]:
    data = yaml_text.load(Path(path).read_text())
    if not isinstance(data, dict) or paper not in data:
        raise ValueError(f"{path} has no section {paper!r}")
    problems = _section_problems(data[paper], paper)
    if problems:
        raise ValueError(f"{path}: " + "; ".join(problems))
    return data[paper] or []


def _nan(x) -> bool:
    return x is None or (isinstance(x, float) and math.isnan(x))


def status_of(
    published: float, reproduced: float, tolerance: float, lo: float | None = None, hi: float | None = None
) -> str:
    """'reproduced' / 'differs' from the value, or, with a CI [lo, hi], from the CI:
    inside the band |x - published| <= tolerance, outside it, or 'fragile' (both)."""
    if _nan(reproduced):
        return "not run"
    if _nan(lo) or _nan(hi):
        return "reproduced" if abs(reproduced - published) <= tolerance + 1e-12 else "differs"
    lo, hi = min(lo, hi), max(lo, hi)
    band_lo, band_hi = published - tolerance - 1e-12, published + tolerance + 1e-12
    inside = hi >= band_lo and lo <= band_hi
    outside = lo < band_lo or hi > band_hi
    if inside and outside:
        return "fragile"
    return "reproduced" if inside else "differs"


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
            "ci_low": float("nan"),
            "ci_high": float("nan"),
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
        elif isinstance(m, Measured):
            value, lo, hi = float(m.value), float(m.lo), float(m.hi)
            row.update(
                reproduced=round(value, 4),
                ci_low=round(lo, 4),
                ci_high=round(hi, 4),
                status=status_of(float(c["value"]), value, float(c.get("tolerance", 0.0)), lo, hi),
                note=m.note,
            )
        else:
            value, note = m if isinstance(m, tuple) else (m, "")
            value = float(value)
            row.update(
                reproduced=round(value, 4),
                status=status_of(float(c["value"]), value, float(c.get("tolerance", 0.0))),
                note=note,
            )
        rows.append(row)
    return pd.DataFrame(rows, columns=COLUMNS)


def summary_report(table: pd.DataFrame, strict: bool = False) -> str:
    """The log of rule published_summary: status counts and every 'fragile' claim listed.
    In strict mode, raises SystemExit when a claim 'differs'; 'fragile' never fails."""
    counts = table["status"].value_counts().to_dict()
    lines = [f"published numbers: {counts}"]
    fragile = table[table["status"] == "fragile"]
    if len(fragile):
        cols = [c for c in ("paper", "id", "published", "tolerance", "reproduced", "ci_low", "ci_high") if c in table]
        lines.append(
            f"{len(fragile)} fragile (the verdict changes within the CI; not a failure):\n{fragile[cols].to_string(index=False)}"
        )
    text = "\n".join(lines)
    if strict and (table["status"] == "differs").any():
        bad = table[table["status"] == "differs"][["paper", "id", "published", "reproduced"]]
        raise SystemExit(f"{text}\nstrict mode: {len(bad)} published numbers differ:\n{bad.to_string(index=False)}")
    return text


def no_real_lms(lm_names, papers) -> str:
    """Why results/published/real_lms.csv has nothing to say in this configuration, and the
    way out: no packaged LM configured (``lms.models``), or neither paper B nor C runs."""
    target = "results/published/real_lms.csv"
    if not lm_names:
        return (
            f"{target}: no real LM is configured (lms.models is empty), so there is no claim to test. "
            "Name packaged models in lms.models (config/config.yaml's default: [smollm2-135m, gemma-3-270m]), "
            "or leave the table out of the targets"
        )
    return (
        f"{target}: papers {', '.join(papers) or '(none)'} has neither coax nor gim, whose claims the table tests "
        "on the real LMs. Add one, as in --config 'papers=[coax,gim]', or leave the table out of the targets"
    )
