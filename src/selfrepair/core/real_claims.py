"""Claims about a method or a phenomenon, tested on a real language model.

The papers' claims about their own models (GPT-2, Pythia, Qwen, Gemma-2, Llama) are
compared with the published numbers in :mod:`selfrepair.core.published`, and stay *not
run* where those weights are absent. A claim that is about a method or a phenomenon
(COAX ranks the backups above every first-order baseline; the backups wake up when the
primaries are ablated; GIM has the best CPR of the gradient methods) can also be tested on
another model. Each such test is one row: the measured effect with its 95% interval, and
a verdict on the claim's direction:

* *holds*: the whole interval lies on the claim's side of its threshold;
* *fails*: the whole interval lies on the other side (or on the threshold);
* *inconclusive*: the interval straddles the threshold, or there is no interval;
* *not run*: the measurement could not be made (the reason is the note).

``n`` counts the units that were resampled for the interval, and ``resampled`` names
them (pairs, prompts, sequences, candidate heads and truth prompts ...): the interval is
over what varies, so a row whose measurement rests on one draw of something says so.

The row also carries the published figure on the paper's own model, for comparison: a
finding about another model, beside (never instead of) the published number.
"""

from __future__ import annotations

import math

import pandas as pd

VERDICTS = ("holds", "inconclusive", "fails", "not run")
COLUMNS = [
    "model",
    "paper",
    "id",
    "claim",
    "measured",
    "ci_low",
    "ci_high",
    "n",
    "resampled",
    "verdict",
    "published",
    "note",
]


def _finite(x) -> bool:
    return isinstance(x, int | float) and math.isfinite(float(x))


def verdict(lo, hi, threshold: float = 0.0, side: str = "above") -> str:
    """The verdict on a claim that the measured effect lies ``side`` ('above' or 'below')
    ``threshold``, from the effect's interval [lo, hi]."""
    if side not in ("above", "below"):
        raise ValueError(f"side must be 'above' or 'below', not {side!r}")
    if not (_finite(lo) and _finite(hi)):
        return "inconclusive"
    if lo > hi:
        raise ValueError(f"interval [{lo}, {hi}] has its low end above its high end")
    if side == "above":
        return "holds" if lo > threshold else "fails" if hi <= threshold else "inconclusive"
    return "holds" if hi < threshold else "fails" if lo >= threshold else "inconclusive"


def row(
    model: str,
    paper: str,
    cid: str,
    claim: str,
    published: str,
    measured=float("nan"),
    ci=(float("nan"), float("nan")),
    n=None,
    threshold: float = 0.0,
    side: str = "above",
    note: str = "",
    resampled: str = "",
) -> dict:
    """One claim tested on one model (:data:`COLUMNS`); its verdict from ``ci``, which was
    taken over ``n`` resampled ``resampled`` (required with an interval)."""
    lo, hi = ci
    if _finite(lo) and _finite(hi) and not resampled:
        raise ValueError(f"claim {cid!r}: an interval needs the name of what was resampled (resampled=)")
    return {
        "model": model,
        "paper": paper,
        "id": cid,
        "claim": claim,
        "measured": measured,
        "ci_low": lo,
        "ci_high": hi,
        "n": n,
        "resampled": resampled,
        "verdict": verdict(lo, hi, threshold, side),
        "published": published,
        "note": note,
    }


def not_run(model: str, paper: str, cid: str, claim: str, published: str, reason: str) -> dict:
    """A claim that could not be tested on ``model``: the reason is its note."""
    out = row(model, paper, cid, claim, published, note=reason)
    out["verdict"] = "not run"
    return out


def table(rows: list[dict]) -> pd.DataFrame:
    t = pd.DataFrame(rows, columns=COLUMNS)
    bad = sorted(set(t["verdict"]) - set(VERDICTS))
    if bad:
        raise ValueError(f"unknown verdicts {bad}; one of {', '.join(VERDICTS)}")
    return t


def counts(t: pd.DataFrame) -> pd.DataFrame:
    """Per model, how many claims came out each way (:data:`VERDICTS` columns)."""
    c = t.groupby("model", sort=False)["verdict"].value_counts().unstack(fill_value=0)
    return c.reindex(columns=list(VERDICTS), fill_value=0)
