"""Claims that do not hang on one sample or one model.

Paper A's C is a mean over n_eval evaluation sequences of a 0/1 per-sequence outcome, so
C, Delta = rank(G) - rank(C) and the role (hero / bloat / aligned) carry sampling
noise. This module measures it from the per-sequence exact-match outcomes that rule
heroes_scores saves (``outcomes.pt``):

* ``within_se``: which components' C lies within 2 SE of zero, or of another's C;
* ``bootstrap_roles``: resample the sequences with replacement, recompute every C and so
  Delta and the role; a component's stability is the share of resamples in which it
  keeps the role it has on the full sample (and rho(G, C) gets a per-seed interval);
* ``paired_difference``: a per-seed paired difference (cell - default) with a percentile
  bootstrap CI over seeds, for the protocol grid.

Outcome matrices here are bool/0-1 arrays [n sequences, 1 + n components]: column 0 is
the intact model, column 1 + i the model with component i ablated.
"""

from __future__ import annotations

import math
from typing import Mapping, Sequence

import numpy as np
import pandas as pd
from scipy import stats

from selfrepair.core import analysis

Z_SE = 2.0  # "within 2 SE"


def _diffs(outcomes) -> np.ndarray:
    """Per-sequence drops [N, n]: baseline - ablated outcome."""
    o = np.asarray(outcomes, dtype=float)
    if o.ndim != 2 or o.shape[1] < 2:
        raise ValueError(f"outcomes must be [sequences, 1 + components], got shape {o.shape}")
    return o[:, :1] - o[:, 1:]


def within_se(outcomes, z: float = Z_SE) -> pd.DataFrame:
    """Per component (in column order): C, its paired SE, whether |C| <= z SE (within
    noise of zero), how many other components' C lie within z paired SE of its own
    (SE of the per-sequence difference of the two ablated outcomes) and whether any does."""
    d = _diffs(outcomes)
    n_seq, n = d.shape
    c = d.mean(0)
    se = d.std(0, ddof=1) / math.sqrt(n_seq) if n_seq > 1 else np.full(n, np.nan)
    close = np.zeros(n, int)
    for i in range(n):
        for j in range(i + 1, n):
            pair = d[:, i] - d[:, j]
            s = pair.std(ddof=1) / math.sqrt(n_seq) if n_seq > 1 else float("nan")
            if abs(pair.mean()) <= z * s + 1e-12:
                close[i] += 1
                close[j] += 1
    return pd.DataFrame(
        {
            "C": c,
            "C_se": se,
            "C_within_2se_of_zero": np.abs(c) <= z * se + 1e-12,
            "C_close": close,
            "C_within_2se_of_other": close > 0,
        }
    )


def resample_indices(n_seq: int, n_boot: int, seed: int) -> np.ndarray:
    """[n_boot, n_seq] indices of sequences drawn with replacement (seeded)."""
    rng = np.random.default_rng(seed)
    return rng.integers(0, n_seq, (n_boot, n_seq))


def resampled_c(outcomes, idx: np.ndarray) -> np.ndarray:
    """C of every component on every resample [n_boot, n] (resample b = rows idx[b])."""
    d = _diffs(outcomes)
    idx = np.asarray(idx)
    n_boot, m = idx.shape
    n_seq = d.shape[0]
    counts = np.bincount((np.arange(n_boot)[:, None] * n_seq + idx).ravel(), minlength=n_boot * n_seq)
    return counts.reshape(n_boot, n_seq).astype(float) @ d / m


def _roles(delta: np.ndarray, t: float) -> np.ndarray:
    """analysis.role, vectorized: 0 aligned, 1 hero (Delta <= -t), 2 bloat (Delta >= t)."""
    return np.where(delta <= -t, 1, np.where(delta >= t, 2, 0))


ROLE_NAMES = np.array(["aligned", "hero", "bloat"])


def bootstrap_roles(
    outcomes,
    g: Sequence[float],
    thresholds: Sequence[float],
    n_boot: int = 1000,
    seed: int = 0,
    idx: np.ndarray | None = None,
    level: float = 0.95,
) -> tuple[pd.DataFrame, dict]:
    """Resample the evaluation sequences, recompute C, Delta and roles (G is fixed: it
    comes from other batches).

    Returns (per component: ``role_t{t}`` on the full sample and ``stability_t{t}``,
    the share of resamples in which the component keeps that role, for each threshold),
    and a dict with the percentile interval of rho(G, C) over resamples
    (``rho_boot_lo``, ``rho_boot_hi``; NaN where C is constant) and ``n_boot``.
    ``idx`` replaces the random resamples (e.g. all of them, for a brute-force check).
    """
    g = np.asarray(g, float)
    d = _diffs(outcomes)
    if len(g) != d.shape[1]:
        raise ValueError(f"{len(g)} gradients for {d.shape[1]} components")
    if idx is None:
        idx = resample_indices(d.shape[0], n_boot, seed)
    cb = resampled_c(outcomes, idx)
    rank_g = stats.rankdata(g)
    rank_cb = stats.rankdata(cb, axis=1)
    delta_b = rank_g[None, :] - rank_cb
    delta = rank_g - stats.rankdata(d.mean(0))
    out = pd.DataFrame(index=range(len(g)))
    for t in thresholds:
        ref = _roles(delta, t)
        out[f"role_t{t:g}"] = ROLE_NAMES[ref]
        out[f"stability_t{t:g}"] = (_roles(delta_b, t) == ref[None, :]).mean(0)
    # Spearman rho per resample: Pearson correlation of the (average) ranks
    rg = rank_g - rank_g.mean()
    rc = rank_cb - rank_cb.mean(1, keepdims=True)
    den = np.sqrt((rg**2).sum() * (rc**2).sum(1))
    with np.errstate(invalid="ignore", divide="ignore"):
        rho = np.where(den > 0, rc @ rg / np.where(den > 0, den, 1), np.nan)
    rho = rho[~np.isnan(rho)]
    lo, hi = (
        np.quantile(rho, [(1 - level) / 2, 1 - (1 - level) / 2]) if len(rho) and np.ptp(g) > 0 else (np.nan, np.nan)
    )
    return out, {"rho_boot_lo": float(lo), "rho_boot_hi": float(hi), "n_boot": int(len(idx))}


def paired_difference(
    cell: Mapping[int, float], default: Mapping[int, float], n_boot: int = 10000, seed: int = 0, level: float = 0.95
) -> dict:
    """Per-seed differences cell - default over the seeds both have (a NaN on either side
    drops the seed): their number, mean, sd, a percentile bootstrap CI over seeds of the
    mean, and ``decided`` (the CI excludes 0)."""
    seeds = [s for s in cell if s in default and not (math.isnan(float(cell[s])) or math.isnan(float(default[s])))]
    diffs = [float(cell[s]) - float(default[s]) for s in seeds]
    mean, sd, n = analysis.mean_sd(diffs)
    lo, hi = analysis.bootstrap_ci(diffs, n_boot=n_boot, level=level, seed=seed)
    decided = bool(n > 1 and (lo > 0 or hi < 0))
    return {
        "n_paired": n,
        "seeds": " ".join(str(int(s)) for s in sorted(seeds)),
        "mean_diff": mean,
        "sd_diff": sd,
        "ci_lo": lo,
        "ci_hi": hi,
        "decided": decided,
    }


def change_word(n_paired: int, lo: float, hi: float) -> str:
    """A cell's change vs the default from the paired CI of (cell - default)."""
    if not n_paired:
        return "no paired seeds"
    if n_paired < 2 or math.isnan(lo) or math.isnan(hi):
        return "no clear change (one paired seed)"
    if lo > 0:
        return "raises"
    if hi < 0:
        return "lowers"
    return "no clear change"
