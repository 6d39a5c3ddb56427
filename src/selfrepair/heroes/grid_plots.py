"""Figures of paper A's protocol grid: each function draws one table."""

from __future__ import annotations

import numpy as np
import pandas as pd

from selfrepair.core.plots import _empty, plt, save

TASKS = ("reverse", "sort")
PUBLISHED_RHO = {"reverse": (0.72, 0.08), "sort": (0.27, 0.24)}


def rho_by_cell(seeds: pd.DataFrame, rho: pd.DataFrame, paths) -> None:
    """rho per cell, one dot per seed, mean and bootstrap CI; reversal and sorting side
    by side; the published value as a band."""
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.8), sharey=True)
    k = seeds[seeds["status"] == "kept"] if "status" in seeds else seeds
    cells = list(dict.fromkeys(rho["cell"]))
    for ax, task in zip(axes, TASKS):
        s = k[k["task"] == task]
        if s.empty:
            _empty(ax)
            continue
        pub, sd = PUBLISHED_RHO[task]
        ax.axhspan(pub - sd, pub + sd, color="#f5b041", alpha=0.25, label=f"published {pub} +- {sd}")
        rng = np.random.default_rng(0)
        for i, cell in enumerate(cells):
            v = s.loc[s["cell"] == cell, "rho"].astype(float)
            ax.scatter(i + rng.uniform(-0.12, 0.12, len(v)), v, s=14, color="#34495e", alpha=0.7, zorder=3)
            r = rho[(rho["cell"] == cell) & (rho["task"] == task)]
            if len(r) and not np.isnan(r["rho_mean"].iloc[0]):
                m, lo, hi = (float(r[c].iloc[0]) for c in ("rho_mean", "ci_lo", "ci_hi"))
                ax.errorbar(
                    i + 0.25,
                    m,
                    yerr=[[m - lo], [hi - m]] if not np.isnan(lo) else None,
                    fmt="D",
                    color="#c0392b",
                    ms=5,
                    capsize=3,
                    zorder=4,
                )
        ax.set_xticks(range(len(cells)), cells, rotation=30, ha="right", fontsize=8)
        ax.axhline(0, color="k", lw=0.5)
        ax.set_title(f"{task}: rho(G, C) per protocol cell")
        ax.legend(frameon=False, fontsize=7, loc="lower left")
    axes[0].set_ylabel("Spearman rho (dot = seed; diamond = mean, 95% CI)")
    save(fig, paths)


def rho_vs_n(noise: pd.DataFrame, paths) -> None:
    """rho and its chunk-to-chunk sd vs the number of evaluation sequences."""
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
    if noise.empty:
        for ax in axes:
            _empty(ax, "no sweep")
        save(fig, paths)
        return
    for task in TASKS:
        s = noise[noise["task"] == task].sort_values("n")
        if s.empty:
            continue
        axes[0].errorbar(s["n"], s["rho_mean"], yerr=s["rho_sd_chunks"], marker="o", capsize=3, label=task)
        axes[1].plot(s["n"], 100 * s["pairs_within_noise"], marker="o", label=task)
    for ax in axes:
        ax.set_xscale("log")
        ax.set_xlabel("evaluation sequences n")
        ax.legend(frameon=False, fontsize=8)
    axes[0].set_ylabel("rho (mean over seeds; bar: sd over chunks)")
    axes[0].set_title("rho vs evaluation-sample count")
    axes[1].set_ylabel("% component pairs with C difference within noise")
    axes[1].set_title("C differences within 1.96 SE")
    save(fig, paths)


def superadditivity(table: pd.DataFrame, paths) -> None:
    """Joint / mean individual drop of the bloats (and heroes) per cell, with CIs."""
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.6), sharey=False)
    for ax, task in zip(axes, TASKS):
        s = table[table["task"] == task] if not table.empty else table
        if s.empty:
            _empty(ax, "no heroes or bloats")
            continue
        cells = list(dict.fromkeys(s["cell"]))
        for j, (group, label, color) in enumerate((("bloat", "bloats", "#2471a3"), ("hero", "heroes", "#c0392b"))):
            g = s[s["group"] == group].set_index("cell").reindex(cells)
            x = np.arange(len(cells)) + (j - 0.5) * 0.3
            ratio = g["ratio"].astype(float).values
            lo = np.nan_to_num(ratio - g["ci_lo"].astype(float).values, nan=0.0)
            hi = np.nan_to_num(g["ci_hi"].astype(float).values - ratio, nan=0.0)
            ax.errorbar(
                x,
                ratio,
                yerr=[np.clip(lo, 0, None), np.clip(hi, 0, None)],
                fmt="o",
                color=color,
                capsize=3,
                label=label,
            )
        ax.axhline(1, color="k", lw=0.5)
        ax.set_yscale("symlog", linthresh=1)  # ratios span -5..150 across cells
        if task == "sort":
            ax.axhline(14, color="#f5b041", lw=1, ls="--", label="published 14x (bloats)")
        ax.set_xticks(range(len(cells)), cells, rotation=30, ha="right", fontsize=8)
        ax.set_title(f"{task}: joint / mean individual drop")
        ax.legend(frameon=False, fontsize=7)
    axes[0].set_ylabel("superadditivity (95% CI over seeds; symlog)")
    save(fig, paths)
