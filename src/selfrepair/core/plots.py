"""Figures: each function draws one table (a DataFrame) and saves PNG and PDF."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import seaborn as sns  # noqa: E402
from matplotlib.patches import Patch  # noqa: E402

ROLE_COLORS = {"hero": "#c0392b", "bloat": "#2471a3", "aligned": "#95a5a6"}


# No creation date in a PDF: the same table draws the same bytes on every run.
_METADATA = {".pdf": {"CreationDate": None}}


def save(fig, paths) -> None:
    for p in paths if isinstance(paths, (list, tuple)) else [paths]:
        Path(p).parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(p, dpi=150, bbox_inches="tight", metadata=_METADATA.get(Path(p).suffix))
    plt.close(fig)


def _empty(ax, text="no kept seeds"):
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes)
    ax.set_axis_off()


def _rho_title(task: str, rows: pd.DataFrame) -> str:
    """The panel title from the task's row of the rho table (nothing is computed here).

    ``n_kept`` counts the kept seeds with a defined rho: with none (every kept seed has
    a constant G or C, e.g. an OOD accuracy of 0, so rho is undefined) the title says so
    rather than 'nan ± nan (0 seeds)'; with one seed there is no sd.
    """
    n = int(rows["n_kept"].iloc[0]) if len(rows) else 0
    if n == 0:
        return f"{task}: no kept seeds with a defined rho"
    r = rows.iloc[0]
    if n == 1:
        return f"{task}: rho = {r['mean']:.2f} (1 seed)"
    return f"{task}: rho = {r['mean']:.2f} ± {r['sd']:.2f} ({n} seeds)"


def g_vs_c(roles: pd.DataFrame, rho: pd.DataFrame, paths) -> None:
    tasks = list(dict.fromkeys(roles["task"]))
    fig, axes = plt.subplots(1, max(1, len(tasks)), figsize=(5 * max(1, len(tasks)), 4), squeeze=False)
    kept = roles[roles["status"] == "kept"]
    for ax, task in zip(axes[0], tasks):
        d = kept[kept["task"] == task]
        if d.empty:
            _empty(ax)
            continue
        for r, dd in d.groupby("role"):
            ax.scatter(dd["G"], dd["C"], s=14, alpha=0.75, color=ROLE_COLORS.get(r, "k"), label=r)
        ax.set_title(_rho_title(task, rho[(rho["task"] == task) & (rho["measure"] == "rho")]))
        ax.set_xlabel("gradient magnitude G")
        ax.set_ylabel("causal importance C (accuracy drop)")
        ax.legend(frameon=False, fontsize=8)
    save(fig, paths)


def waterfall(roles: pd.DataFrame, paths, threshold: float = 6) -> None:
    kept = roles[roles["status"] == "kept"]
    tasks = list(dict.fromkeys(roles["task"]))
    # constrained layout keeps each panel's rotated component names clear of the next title
    fig, axes = plt.subplots(
        max(1, len(tasks)), 1, figsize=(10, 3.4 * max(1, len(tasks))), squeeze=False, layout="constrained"
    )
    if not tasks:
        _empty(axes[0, 0])
    for ax, task in zip(axes[:, 0], tasks):
        d = (
            kept[kept["task"] == task]
            .groupby("component", sort=False)
            .agg(delta=("delta", "mean"), layer=("layer", "first"))
            .reset_index()
        )
        if d.empty:
            _empty(ax)
            continue
        d = d.sort_values("delta")
        colors = [
            ROLE_COLORS["hero"]
            if x <= -threshold
            else ROLE_COLORS["bloat"]
            if x >= threshold
            else ROLE_COLORS["aligned"]
            for x in d["delta"]
        ]
        ax.bar(d["component"], d["delta"], color=colors)
        ax.axhline(0, color="k", lw=0.6)
        ax.set_ylabel("mean Δ = rank(G) − rank(C)")
        ax.set_title(f"{task}: per-component rank difference (mean over kept seeds)")
        ax.tick_params(axis="x", rotation=90, labelsize=7)
    legend = [
        Patch(color=ROLE_COLORS["hero"], label=f"hidden hero (Δ ≤ −{threshold:g})"),
        Patch(color=ROLE_COLORS["bloat"], label=f"gradient bloat (Δ ≥ {threshold:g})"),
        Patch(color=ROLE_COLORS["aligned"], label="aligned"),
    ]
    fig.legend(handles=legend, loc="outside upper center", ncols=3, frameon=False, fontsize=8)
    save(fig, paths)


def roles_by_layer(table: pd.DataFrame, paths) -> None:
    tasks = list(dict.fromkeys(table["task"])) if not table.empty else []
    ths = sorted(table["threshold"].unique()) if not table.empty else []
    fig, axes = plt.subplots(
        max(1, len(tasks)), max(1, len(ths)), figsize=(3.6 * max(1, len(ths)), 3 * max(1, len(tasks))), squeeze=False
    )
    if table.empty:
        _empty(axes[0, 0])
    for i, task in enumerate(tasks):
        for j, t in enumerate(ths):
            ax = axes[i, j]
            d = table[(table["task"] == task) & (table["threshold"] == t)].sort_values("layer")
            x = np.arange(len(d))
            ax.bar(x - 0.2, d["hero"], 0.4, color=ROLE_COLORS["hero"], label="heroes")
            ax.bar(x + 0.2, d["bloat"], 0.4, color=ROLE_COLORS["bloat"], label="bloats")
            ax.set_xticks(x, [f"layer {v}" for v in d["layer"]], fontsize=8)
            ax.set_title(f"{task}, |Δ| ≥ {t:g}", fontsize=9)
            if j == 0:
                ax.set_ylabel("count over seeds")
            if i == 0 and j == 0:
                ax.legend(frameon=False, fontsize=8)
    save(fig, paths)


def role_stability(table: pd.DataFrame, paths) -> None:
    tasks = list(dict.fromkeys(table["task"])) if not table.empty else []
    fig, axes = plt.subplots(max(1, len(tasks)), 1, figsize=(10, 3 * max(1, len(tasks))), squeeze=False)
    if table.empty:
        _empty(axes[0, 0])
    for ax, task in zip(axes[:, 0], tasks):
        d = table[table["task"] == task]
        x = np.arange(len(d))
        ax.bar(x, d["hero"], color=ROLE_COLORS["hero"], label="hero")
        ax.bar(x, d["bloat"], bottom=d["hero"], color=ROLE_COLORS["bloat"], label="bloat")
        ax.set_xticks(x, d["component"], rotation=90, fontsize=7)
        ax.set_ylabel(f"seeds (of {int(d['n_seeds'].max())})")
        ax.set_title(f"{task}: how often each component is a hero or a bloat")
        ax.legend(frameon=False, fontsize=8)
    save(fig, paths)


def redundancy(table: pd.DataFrame, paths) -> None:
    fig, ax = plt.subplots(figsize=(6, 3.6))
    if table.empty:
        _empty(ax, "no heroes or bloats found")
    else:
        labels = [f"{t}\n{g}s" for t, g in zip(table["task"], table["group"])]
        x = np.arange(len(table))
        ax.bar(x - 0.2, 100 * table["sum_individual_drop"], 0.4, label="sum of individual drops", color="#7f8c8d")
        ax.bar(x + 0.2, 100 * table["joint_drop"], 0.4, label="joint drop", color="#8e44ad")
        ax.set_xticks(x, labels, fontsize=8)
        ax.set_ylabel("OOD accuracy drop (points)")
        ax.legend(frameon=False, fontsize=8)
        ax.set_title("Individual vs joint ablation (mean over seeds)")
    save(fig, paths)


def pruning(table: pd.DataFrame, paths) -> None:
    tasks = list(dict.fromkeys(table["task"])) if not table.empty else []
    fig, axes = plt.subplots(1, max(1, len(tasks)), figsize=(5 * max(1, len(tasks)), 3.6), squeeze=False)
    if table.empty:
        _empty(axes[0, 0])
    for ax, task in zip(axes[0], tasks):
        d = table[table["task"] == task]
        sns.lineplot(data=d, x="k", y="accuracy", hue="order", ax=ax, errorbar="sd")
        ax.set_xlabel("components removed")
        ax.set_ylabel("OOD accuracy")
        ax.set_title(f"{task}: pruning by gradient vs by causal score")
    save(fig, paths)


def attention(stats: pd.DataFrame, patterns: pd.DataFrame, paths) -> None:
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.8))
    d = stats.dropna(subset=["role"])
    if d.empty:
        for ax in axes:
            _empty(ax)
        save(fig, paths)
        return
    sns.boxplot(data=d, x="role", y="entropy", hue="role", palette=ROLE_COLORS, ax=axes[0], legend=False)
    axes[0].set_title("attention entropy by role (nats)")
    for ax, role in zip(axes[1:], ("hero", "bloat")):
        cand = d[d["role"] == role]
        if cand.empty:
            _empty(ax, f"no {role} head")
            continue
        pick = cand.sort_values("entropy").iloc[0] if role == "hero" else cand.sort_values("entropy").iloc[-1]
        p = patterns[
            (patterns["task"] == pick["task"])
            & (patterns["seed"] == pick["seed"])
            & (patterns["component"] == pick["component"])
        ]
        n = int(p["query"].max()) + 1
        m = np.full((n, n), np.nan)
        m[p["query"].astype(int), p["key"].astype(int)] = p["weight"]
        ax.imshow(m, cmap="viridis", vmin=0, vmax=1)
        ax.set_title(f"{role} {pick['component']} ({pick['task']}, seed {pick['seed']})", fontsize=9)
        ax.set_xlabel("key position")
        ax.set_ylabel("query position")
    save(fig, paths)


def faithfulness_curves(curves: pd.DataFrame, panel: tuple[str, str] = ("task", "model")):
    """Faithfulness against the fraction of edges kept (log scale), one column per
    distinct ``panel`` pair of the table (in its order), the signed ranking (CPR) above
    the absolute one (CMD), one line per method: the mean over the ``seed`` column where
    there is one, each seed's curve faint beside it. Returns the figure (the caller saves
    it): paper C's toy models and the real LMs draw their ``curves.csv`` with it."""
    pairs = curves[list(panel)].drop_duplicates().values.tolist()
    fig, axes = plt.subplots(
        2, max(1, len(pairs)), figsize=(3.6 * max(1, len(pairs)), 6.4), squeeze=False, sharey="row"
    )
    for col, (a, b) in enumerate(pairs):
        for row, ranking in enumerate(("signed", "absolute")):
            ax = axes[row, col]
            sub = curves[(curves[panel[0]] == a) & (curves[panel[1]] == b) & (curves["ranking"] == ranking)]
            seeds = sorted(sub["seed"].unique()) if "seed" in sub else [None]
            for method, g in sub.groupby("method", sort=False):
                # one line per method: the mean over training seeds; each seed's curve faint
                mean = g.groupby("fraction", sort=True)["faithfulness"].mean()
                line = ax.plot(mean.index, mean.values, marker="o", ms=3, label=method)[0]
                if len(seeds) > 1:
                    for _, gs in g.groupby("seed"):
                        ax.plot(gs.fraction, gs.faithfulness, color=line.get_color(), lw=0.5, alpha=0.35)
            ax.set_xscale("log")
            ax.axhline(1.0, color="grey", lw=0.5)
            n_seeds = f", mean of {len(seeds)} seeds" if len(seeds) > 1 else ""
            ax.set_title(f"{a} / {b}{n_seeds}\n{'CPR (signed)' if row == 0 else 'CMD (absolute)'}", fontsize=9)
            ax.set_xlabel("fraction of edges")
            if col == 0:
                ax.set_ylabel("faithfulness")
    axes[0, -1].legend(fontsize=7)
    fig.tight_layout()
    return fig
