"""The ground truth's figures; each draws one table (no computation beyond a pivot).

Every text is set at ``FONT`` points or more and the figure grows with the table (inches
per column, row and panel), so that a run of one paper and a run of all three read
alike at the saved size; long titles are wrapped to the figure's width and the layout is
constrained, so that nothing is cut at an edge.
"""

from __future__ import annotations

import textwrap

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402

from selfrepair.groundtruth.tables import METHODS  # noqa: E402

FONT = 9  # points: the smallest text of these figures
DPI = 150
METRIC_NAMES = {
    "spearman": "Spearman's ρ",
    "kendall": "Kendall's τ",
    "top_k_share": "top-k share",
    "hidden_recall": "recall of the hidden components",
}
EMPTY = "n/a"  # a cell without a value: no model with a defined agreement


def _wrap(text: str, width_in: float, size: float) -> str:
    """``text`` broken into lines that fit ``width_in`` inches at ``size`` points (a
    character is at most about 0.6 em wide in the default sans-serif font); existing
    line breaks are kept."""
    chars = max(20, int(width_in * 72 / (0.6 * size)))
    return "\n".join(textwrap.fill(line, chars) for line in text.split("\n"))


def _save(fig, path) -> None:
    fig.savefig(path, dpi=DPI)
    plt.close(fig)


def agreement_figure(summary: pd.DataFrame, metric: str = "spearman"):
    """The figure of :func:`agreement_heatmap`, not saved."""
    t = summary.assign(column=summary["group"] + "\n" + summary["game"])
    cols = list(dict.fromkeys(t["column"]))
    rows = [m for m in METHODS if m in set(t["method"])] + sorted(set(t["method"]) - set(METHODS))

    def pivot(values: str) -> pd.DataFrame:
        return t.pivot_table(index="method", columns="column", values=values).reindex(index=rows, columns=cols)

    val, lo, hi = pivot(metric), pivot(f"{metric}_lo"), pivot(f"{metric}_hi")
    n = t.groupby("column")["n_models"].max().reindex(cols)
    width = max(6.0, 1.4 * len(cols) + 2.8)
    fig, ax = plt.subplots(figsize=(width, 0.5 * len(rows) + 2.4), layout="constrained")
    cmap = plt.get_cmap("RdBu").with_extremes(bad="0.92")
    v = np.ma.masked_invalid(val.to_numpy(dtype=float))
    im = ax.imshow(v, cmap=cmap, vmin=-1, vmax=1, aspect="auto")
    for i in range(len(rows)):
        for j in range(len(cols)):
            x = val.iat[i, j]
            if not np.isfinite(x):
                ax.text(j, i, EMPTY, ha="center", va="center", fontsize=FONT, color="0.35")
                continue
            label = f"{x:.2f}"
            if np.isfinite(lo.iat[i, j]) and np.isfinite(hi.iat[i, j]):
                label += f"\n[{lo.iat[i, j]:.2f}, {hi.iat[i, j]:.2f}]"
            ax.text(j, i, label, ha="center", va="center", fontsize=FONT, color="white" if abs(x) > 0.6 else "black")
    models = [f"{int(k)} model" + ("s" if int(k) != 1 else "") for k in n]
    ax.set_xticks(range(len(cols)), [f"{c}\n({m})" for c, m in zip(cols, models)], fontsize=FONT)
    ax.set_yticks(range(len(rows)), rows, fontsize=FONT)
    ax.tick_params(length=0)
    name = METRIC_NAMES.get(metric, metric)
    title = (
        f"{name} of each method's scores with the Shapley values\nmean over models "
        f"[95% bootstrap interval]; {EMPTY}: no model with a defined value"
    )
    fig.suptitle(_wrap(title, width - 0.4, FONT + 2), fontsize=FONT + 2)
    cb = fig.colorbar(im, ax=ax, fraction=0.04, pad=0.02)
    cb.set_label(name, fontsize=FONT)
    cb.ax.tick_params(labelsize=FONT)
    return fig


def agreement_heatmap(summary: pd.DataFrame, path, metric: str = "spearman") -> None:
    """Method x (group, game) heat map of the mean ``metric`` over models (agreement.csv),
    each cell annotated with the mean and its bootstrap interval (the mean alone with one
    model), "n/a" where no model has a value; the column labels say how many models."""
    _save(agreement_figure(summary, metric), path)


def _no_correlation(x: pd.Series, y: pd.Series) -> str | None:
    """Why a panel has no rank correlation (its points as they are drawn), or None."""
    if len(x) == 0:
        return "no component scored"
    if len(x) == 1:
        return "one component scored:\nno rank correlation"
    if x.nunique() < 2:
        return f"every Shapley value is {x.iloc[0]:.3g}:\nno rank correlation"
    if y.nunique() < 2:
        return f"every score is {y.iloc[0]:.3g}:\nno rank correlation"
    return None


def scatter_figure(
    shapley: pd.DataFrame, scores: pd.DataFrame, methods=("single", "grad_norm", "atp", "gim", "coax_comp")
):
    """The figure of :func:`method_scatter`, not saved."""
    from selfrepair.groundtruth.tables import GAME_OF

    models = list(shapley.drop_duplicates("group")["model"])
    width = 2.7 * len(methods) + 1.0
    fig, axes = plt.subplots(
        len(models),
        len(methods),
        figsize=(width, 2.3 * len(models) + 1.0),
        squeeze=False,
        layout="constrained",
    )
    for i, model in enumerate(models):
        s = shapley[shapley["model"] == model]
        game = GAME_OF.get(s["family"].iloc[0], s["game"].iloc[0])
        s = s[s["game"] == game].set_index("component")
        sc = scores[(scores["model"] == model) & (scores["game"] == game)]
        for j, m in enumerate(methods):
            ax = axes[i, j]
            g = sc[sc["method"] == m].set_index("component")["score"]
            x = s.loc[g.index]
            ax.errorbar(x["shapley"], g, xerr=x["se"], fmt="o", ms=3, lw=0.7, alpha=0.8)
            ax.axhline(0, color="grey", lw=0.4)
            ax.axvline(0, color="grey", lw=0.4)
            why = _no_correlation(x["shapley"], g)
            if why:  # said in a band added above the points, so that it hides none of them
                y0, y1 = ax.get_ylim()
                ax.set_ylim(y0, y1 + 0.9 * (y1 - y0))
                ax.text(
                    0.5,
                    0.95,
                    why,
                    transform=ax.transAxes,
                    ha="center",
                    va="top",
                    fontsize=FONT,
                    bbox={"boxstyle": "round", "facecolor": "white", "edgecolor": "0.6", "alpha": 0.9},
                )
            for axis in (ax.xaxis, ax.yaxis):
                axis.set_major_locator(MaxNLocator(nbins=4))
                axis.get_offset_text().set_fontsize(FONT)
            ax.tick_params(labelsize=FONT)
            if i == 0:
                ax.set_title(m, fontsize=FONT + 1)
            if j == 0:
                ax.set_ylabel(f"{model}\nscore (game: {game})", fontsize=FONT)
            if i == len(models) - 1:
                ax.set_xlabel("Shapley value", fontsize=FONT)
    title = (
        "Each method's score (columns) against the Shapley value ± its standard error, one point per head "
        "or MLP\nthe first model of each group (rows), on its headline game"
    )
    fig.suptitle(_wrap(title, width - 0.4, FONT + 2), fontsize=FONT + 2)
    return fig


def method_scatter(
    shapley: pd.DataFrame, scores: pd.DataFrame, path, methods=("single", "grad_norm", "atp", "gim", "coax_comp")
) -> None:
    """Per model (rows) and method (columns): each component's score against its Shapley
    value, on the model's headline game (paper A: accuracy; the others: logit_diff), with
    the Shapley SE as error bars; the first model of each group. A panel without a rank
    correlation (fewer than two components scored, or constant values) says why."""
    _save(scatter_figure(shapley, scores, methods), path)
