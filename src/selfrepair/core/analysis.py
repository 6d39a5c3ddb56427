"""Ranks, roles and statistics shared by the papers."""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np
import pandas as pd
from scipy import stats

ROLES = ("hero", "bloat", "aligned")


def rank_delta(g: Sequence[float], c: Sequence[float]) -> np.ndarray:
    """Delta_i = rank(G_i) - rank(C_i), ascending ranks with ties averaged."""
    return stats.rankdata(g) - stats.rankdata(c)


def role(delta: float, threshold: float) -> str:
    """Hidden hero: Delta <= -t (low gradient, essential); bloat: Delta >= t; else aligned."""
    if delta <= -threshold:
        return "hero"
    if delta >= threshold:
        return "bloat"
    return "aligned"


def roles_table(
    names: Sequence[str], g: Sequence[float], c: Sequence[float], thresholds: Sequence[float]
) -> pd.DataFrame:
    """One row per component: G, C, their ranks, Delta and the role at each threshold."""
    g = np.asarray(g, float)
    c = np.asarray(c, float)
    df = pd.DataFrame({"component": list(names), "G": g, "C": c})
    df["rank_G"] = stats.rankdata(g)
    df["rank_C"] = stats.rankdata(c)
    df["delta"] = df["rank_G"] - df["rank_C"]
    for t in thresholds:
        df[f"role_t{t:g}"] = [role(d, t) for d in df["delta"]]
    return df


def spearman(x: Sequence[float], y: Sequence[float]) -> float:
    """Spearman rho; NaN when either side is constant."""
    x = np.asarray(x, float)
    y = np.asarray(y, float)
    if np.ptp(x) == 0 or np.ptp(y) == 0:
        return float("nan")
    return float(stats.spearmanr(x, y).statistic)


def mean_sd(values: Sequence[float]) -> tuple[float, float, int]:
    v = np.asarray([x for x in values if not math.isnan(x)], float)
    if len(v) == 0:
        return float("nan"), float("nan"), 0
    sd = float(v.std(ddof=1)) if len(v) > 1 else float("nan")
    return float(v.mean()), sd, len(v)


def bootstrap_ci(
    values: Sequence[float], n_boot: int = 10000, level: float = 0.95, seed: int = 0
) -> tuple[float, float]:
    """Percentile bootstrap confidence interval of the mean."""
    v = np.asarray([x for x in values if not math.isnan(x)], float)
    if len(v) < 2:
        return float("nan"), float("nan")
    rng = np.random.default_rng(seed)
    means = v[rng.integers(0, len(v), (n_boot, len(v)))].mean(1)
    lo, hi = np.quantile(means, [(1 - level) / 2, 1 - (1 - level) / 2])
    return float(lo), float(hi)


def bootstrap_stat(rows, fn, n_boot: int = 10000, level: float = 0.95, seed: int = 0) -> tuple[float, float, int]:
    """Percentile bootstrap interval of a statistic of resampled rows: (lo, hi, undefined).

    ``rows``: one entry per unit (a seed), a number or a vector of numbers (shape [n] or
    [n, k]). Each resample draws n rows with replacement, with the same draws as
    ``bootstrap_ci`` (so ``fn=lambda r: r.mean(1)`` gives its interval); ``fn`` maps the
    stacked resamples [n_boot, n, ...] to one value per resample [n_boot], NaN where the
    statistic is undefined on that resample (e.g. a ratio whose denominator is <= 0).
    Undefined resamples are left out of the percentiles and counted in ``undefined``; NaN
    bounds when fewer than 2 rows or no resample is defined."""
    r = np.asarray(rows, float)
    if r.ndim == 0 or len(r) < 2:
        return float("nan"), float("nan"), 0
    rng = np.random.default_rng(seed)
    stat = np.asarray(fn(r[rng.integers(0, len(r), (n_boot, len(r)))]), float)
    ok = ~np.isnan(stat)
    if not ok.any():
        return float("nan"), float("nan"), int(n_boot)
    lo, hi = np.quantile(stat[ok], [(1 - level) / 2, 1 - (1 - level) / 2])
    return float(lo), float(hi), int(n_boot - ok.sum())
