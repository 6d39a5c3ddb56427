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

The table tests many claims at once (about 50 rows on the two packaged LMs), so beside
the plain 95% verdict each row carries ``p``, the two-sided p-value that its own interval
implies for the threshold, and ``verdict_holm``, the verdict after Holm's step-down
adjustment of those p-values over every row of the table that has one (a family-wise
error rate of 5%). ``p`` inverts the interval: the half of it between the estimate and the
threshold is read as 1.96 standard errors of a normal estimate, so ``p`` < 0.05 exactly
when the interval excludes the threshold and the plain verdict is decided. For a
percentile bootstrap or a Student-t interval this is the normal approximation of the
interval's own test, stated as such.

``n`` counts the units that were resampled for the interval, and ``resampled`` names
them (pairs, prompts, sequences, candidate heads and truth prompts ...): the interval is
over what varies, so a row whose measurement rests on one draw of something says so.

The row also carries the published figure on the paper's own model, for comparison: a
finding about another model, beside (never instead of) the published number.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
from scipy import stats

VERDICTS = ("holds", "inconclusive", "fails", "not run")
LEVEL = 0.95  # every row's interval
Z = float(stats.norm.ppf(0.5 + LEVEL / 2))  # 1.959964
COLUMNS = [
    "model",
    "paper",
    "id",
    "claim",
    "measured",
    "ci_low",
    "ci_high",
    "threshold",
    "side",
    "n",
    "resampled",
    "verdict",
    "p",
    "verdict_holm",
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
        "threshold": threshold,
        "side": side,
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


def threshold_half(measured, lo, hi, threshold: float = 0.0) -> float:
    """The half of the interval [lo, hi] between ``measured`` and ``threshold``:
    ``measured - lo`` when the estimate lies above the threshold, ``hi - measured`` below
    it, the half-width when the estimate lies outside its own interval."""
    m, lo, hi = float(measured), float(lo), float(hi)
    if not lo <= m <= hi:
        return (hi - lo) / 2
    return (m - lo) if m > threshold else (hi - m)


def interval_p(measured, lo, hi, threshold: float = 0.0) -> float:
    """The two-sided p-value of ``measured`` against ``threshold`` that its 95% interval
    [lo, hi] implies: the interval's half on the threshold's side (``measured - lo`` when
    the estimate lies above the threshold, ``hi - measured`` below) taken as :data:`Z`
    standard errors. Below 0.05 exactly when the interval excludes the threshold; 1 at
    the threshold; NaN without an interval. An estimate outside its own interval (a
    percentile bootstrap can do that) uses the interval's half-width."""
    if not all(_finite(x) for x in (measured, lo, hi)):
        return float("nan")
    m = float(measured)
    if m == threshold:
        return 1.0
    half = threshold_half(m, lo, hi, threshold)
    if half <= 0:  # a point interval away from the threshold
        return 0.0
    return float(2 * stats.norm.sf(abs(m - threshold) / (half / Z)))


def holm(p) -> np.ndarray:
    """Holm's step-down adjusted p-values (NaN stays NaN and is not counted): the i-th
    smallest of m p-values times (m - i + 1), made monotone, at most 1."""
    p = np.asarray(p, float)
    out = np.full(p.shape, np.nan)
    ok = np.flatnonzero(~np.isnan(p))
    order = ok[np.argsort(p[ok], kind="stable")]
    m = len(order)
    running = 0.0
    for i, j in enumerate(order):
        running = max(running, min(1.0, (m - i) * p[j]))
        out[j] = running
    return out


def _holm_verdict(v: str, measured, threshold, side, p_adj: float, alpha: float) -> str:
    if v == "not run":
        return v
    if not (p_adj < alpha):
        return "inconclusive"
    claim_side = measured > threshold if side == "above" else measured < threshold
    return "holds" if claim_side else "fails"


def table(rows: list[dict], alpha: float = 1 - LEVEL) -> pd.DataFrame:
    """The claims table (:data:`COLUMNS`): each row's interval p-value
    (:func:`interval_p`) and its verdict after Holm's adjustment over the whole table."""
    t = pd.DataFrame(rows, columns=COLUMNS)
    t["n"] = pd.array(t["n"], dtype="Int64")  # a count, empty where not run (never 16.0)
    bad = sorted(set(t["verdict"]) - set(VERDICTS))
    if bad:
        raise ValueError(f"unknown verdicts {bad}; one of {', '.join(VERDICTS)}")
    t["p"] = [
        interval_p(r.measured, r.ci_low, r.ci_high, r.threshold) if r.verdict != "not run" else float("nan")
        for r in t.itertuples()
    ]
    adj = holm(t["p"])
    t["verdict_holm"] = [
        _holm_verdict(r.verdict, r.measured, r.threshold, r.side, a, alpha) for r, a in zip(t.itertuples(), adj)
    ]
    return t


def counts(t: pd.DataFrame) -> pd.DataFrame:
    """Per model, how many claims came out each way (:data:`VERDICTS` columns)."""
    c = t.groupby("model", sort=False)["verdict"].value_counts().unstack(fill_value=0)
    return c.reindex(columns=list(VERDICTS), fill_value=0)
