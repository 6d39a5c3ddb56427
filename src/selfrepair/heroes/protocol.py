"""Paper A's protocol grid: which protocol choices move the published numbers.

Measurements and per-cell tables of the protocol grid; the cells are defined in
:mod:`selfrepair.heroes.grid`.
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np
import pandas as pd

from selfrepair.core import analysis
from selfrepair.core.components import Component
from selfrepair.heroes.grid import BOUNDARIES

# ---- roles ---------------------------------------------------------------------------


def classify(delta: float, threshold: float, boundary: str = "inclusive") -> str:
    """Hero / bloat / aligned. ``inclusive``: |Delta| >= t counts (the paper's text);
    ``strict``: |Delta| > t (the authors' code)."""
    if boundary == "inclusive":
        return analysis.role(delta, threshold)
    if boundary != "strict":
        raise ValueError(f"role boundary must be one of {BOUNDARIES}, not {boundary!r}")
    if delta < -threshold:
        return "hero"
    if delta > threshold:
        return "bloat"
    return "aligned"


def weight_numel(component: Component, d_model: int, d_head: int, d_mlp: int) -> int:
    """Entries of the weight G is taken on: a head's W_V slice or an MLP's W_out."""
    return d_model * d_head if component.is_head else d_mlp * d_model


# ---- one cell from one measurement ----------------------------------------------------


def c_scores(correct: np.ndarray, n_eval: int) -> tuple[np.ndarray, np.ndarray]:
    """C and its paired standard error from exact-match rows [1 + n_components, N]
    (row 0 intact), on the first ``n_eval`` sequences."""
    if n_eval > correct.shape[1]:
        raise ValueError(f"n_eval {n_eval} exceeds the {correct.shape[1]} measured sequences")
    r = correct[:, :n_eval].astype(float)
    diff = r[0][None, :] - r[1:]
    c = diff.mean(1)
    se = diff.std(1, ddof=1) / math.sqrt(n_eval) if n_eval > 1 else np.full(len(c), np.nan)
    return c, se


def cell_components(names, g_raw, numel, correct: np.ndarray, proto: dict, thresholds: Sequence[float]) -> pd.DataFrame:
    """One row per component: G (the cell's normalization), C, C_se, ranks, Delta and the
    role at each threshold (the cell's boundary)."""
    g = np.asarray(g_raw, float)
    if proto["g_normalization"] == "sqrt":
        g = g / np.sqrt(np.asarray(numel, float))
    c, se = c_scores(correct, int(proto["n_eval"]))
    df = analysis.roles_table(list(names), g, c, [])
    df["C_se"] = se
    for t in thresholds:
        df[f"role_t{t:g}"] = [classify(d, t, proto["role_boundary"]) for d in df["delta"]]
    return df


def within_noise(correct: np.ndarray, z: float = 1.96) -> tuple[float, int]:
    """On exact-match rows [1 + n, N]: the fraction of component pairs whose C difference
    is within ``z`` paired standard errors of zero, and the number of components whose C
    is within ``z`` standard errors of zero."""
    r = correct.astype(float)
    n_seq = r.shape[1]
    abl = r[1:]
    n = abl.shape[0]
    pairs = 0
    close = 0
    for i in range(n):
        d = abl[i][None, :] - abl[i + 1 :]  # C_j - C_i per sequence
        if len(d) == 0:
            continue
        m = d.mean(1)
        s = d.std(1, ddof=1) / math.sqrt(n_seq)
        close += int(np.sum(np.abs(m) <= z * s))
        pairs += len(d)
    c, se = c_scores(correct, n_seq)
    zero = int(np.sum(np.abs(c) <= z * se))
    return (close / pairs if pairs else float("nan")), zero


def rho_by_sample_size(g: np.ndarray, correct: np.ndarray, sizes: Sequence[int]) -> pd.DataFrame:
    """rho(G, C) on disjoint chunks of the measured sequences, for each chunk size: one
    row per (n, chunk) with rho, the within-noise fraction of pairs and the number of
    components whose C is within noise of zero."""
    rows = []
    total = correct.shape[1]
    for n in sizes:
        for k in range(total // n):
            chunk = correct[:, k * n : (k + 1) * n]
            c, _ = c_scores(chunk, n)
            frac, zero = within_noise(chunk)
            rows.append(
                {
                    "n": n,
                    "chunk": k,
                    "rho": analysis.spearman(g, c),
                    "pairs_within_noise": frac,
                    "C_within_noise_of_zero": zero,
                }
            )
    return pd.DataFrame(rows, columns=["n", "chunk", "rho", "pairs_within_noise", "C_within_noise_of_zero"])
