"""Paper A's protocol grid: which protocol choices move the published numbers.

Measurements and per-cell tables of the protocol grid; the cells are defined in
:mod:`selfrepair.heroes.grid`.
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np
import pandas as pd
import torch

from selfrepair.core import analysis, interventions
from selfrepair.core.components import Component
from selfrepair.heroes.grid import BOUNDARIES, SITES

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


# ---- ablation at the summed attention output ---------------------------------------


def slice_hooks(sets: Sequence[Sequence[Component]], batch_size: int, mode: str, means: dict | None, d_head: int):
    """Forward hooks on ``blocks.{l}.hook_attn_out`` (after W_O and its bias) for a batch
    repeated ``len(sets)`` times: in copy k, the d_head-wide slice h of every head h in
    ``sets[k]`` is replaced by zeros (zero) or by the head's mean z (mean), as the
    authors' code does. (That slice is not the head's contribution: after W_O every head
    writes to all of d_model.)"""
    if mode not in ("zero", "mean"):
        raise ValueError(f"unknown ablation mode {mode!r}; expected 'zero' or 'mean'")
    per_layer: dict[int, list[tuple[int, int]]] = {}
    for i, s in enumerate(sets):
        for c in s:
            if c.is_head:
                per_layer.setdefault(c.layer, []).append((i, c.head))

    def hook(layer):
        zname = f"blocks.{layer}.attn.hook_z"
        if mode == "mean" and (means is None or zname not in means):
            raise ValueError(f"mean ablation needs the mean of {zname}; compute component_means first")

        def fn(x, hook):
            x = x.clone()
            for i, h in per_layer[layer]:
                rows = slice(i * batch_size, (i + 1) * batch_size)
                cols = slice(h * d_head, (h + 1) * d_head)
                x[rows, :, cols] = 0 if mode == "zero" else means[zname][h].to(x.dtype).to(x.device)
            return x

        return fn

    return [(f"blocks.{layer}.hook_attn_out", hook(layer)) for layer in per_layer]


def ablation_hooks(sets, batch_size: int, mode: str, means: dict | None, site: str, d_head: int):
    """Hooks ablating ``sets[k]`` in copy k of a repeated batch, heads at ``site``
    (MLPs always at their output)."""
    if site not in SITES:
        raise ValueError(f"ablation site must be one of {SITES}, not {site!r}")
    if site == "hook_z":
        return interventions.make_hooks(sets, batch_size, mode, means)
    hooks = slice_hooks(sets, batch_size, mode, means, d_head)
    mlp_sets = [[c for c in s if not c.is_head] for s in sets]
    if any(mlp_sets):
        hooks += interventions.make_hooks(mlp_sets, batch_size, mode, means)
    return hooks


def exact_match_sets(
    bridge, batch, sets, mode: str, means: dict | None, site: str, max_rows: int = 1024
) -> torch.Tensor:
    """Bool [len(sets), B]: exact match of every sequence with each set ablated at ``site``.

    On the bridge's hooks (the authors' slice site is not in the ablation engine of
    ``scores.ablation_correct``), one set per forward at 1000 sequences (``max_rows``): on
    a sorting model, 21 sets, one thread, 11.3 s vs 19.0 s at 8 sets per forward, at both
    sites, with identical outcomes."""
    from selfrepair.heroes.scores import exact_match

    b = len(batch)
    d_head = bridge.cfg.d_head
    per = max(1, max_rows // b)
    rows = []
    with torch.no_grad():
        for start in range(0, len(sets), per):
            group = list(sets[start : start + per])
            rep = batch.tokens.repeat(len(group), 1)
            hooks = ablation_hooks(group, b, mode, means, site, d_head)
            logits = bridge.run_with_hooks(rep, fwd_hooks=hooks) if hooks else bridge(rep)
            for i in range(len(group)):
                rows.append(exact_match(logits[i * b : (i + 1) * b], batch.targets, batch.mask))
    return torch.stack(rows)


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
