"""The ground truth's figures; each draws one table (no computation beyond a pivot)."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from selfrepair.groundtruth.tables import METHODS  # noqa: E402


def agreement_heatmap(summary: pd.DataFrame, path, metric: str = "spearman") -> None:
    """Method x (group, game) heat map of the mean ``metric`` over models (agreement.csv),
    each cell annotated with the mean and its bootstrap interval."""
    t = summary.assign(column=summary["group"] + "\n" + summary["game"])
    cols = list(dict.fromkeys(t["column"]))
    rows = [m for m in METHODS if m in set(t["method"])]
    val = t.pivot_table(index="method", columns="column", values=metric).reindex(index=rows, columns=cols)
    lo = t.pivot_table(index="method", columns="column", values=f"{metric}_lo").reindex(index=rows, columns=cols)
    hi = t.pivot_table(index="method", columns="column", values=f"{metric}_hi").reindex(index=rows, columns=cols)
    fig, ax = plt.subplots(figsize=(1.25 * len(cols) + 3, 0.45 * len(rows) + 1.8))
    im = ax.imshow(val.to_numpy(dtype=float), cmap="RdBu", vmin=-1, vmax=1, aspect="auto")
    for i in range(len(rows)):
        for j in range(len(cols)):
            v = val.iat[i, j]
            if np.isfinite(v):
                ax.text(
                    j, i, f"{v:.2f}\n[{lo.iat[i, j]:.2f}, {hi.iat[i, j]:.2f}]", ha="center", va="center", fontsize=6
                )
    ax.set_xticks(range(len(cols)), cols, fontsize=7)
    ax.set_yticks(range(len(rows)), rows, fontsize=7)
    n = t.groupby("column")["n_models"].max().reindex(cols)
    ax.set_title(
        f"{metric} with the Shapley values, mean over models [95% bootstrap]; models per column: "
        + ", ".join(str(int(x)) for x in n),
        fontsize=8,
    )
    fig.colorbar(im, ax=ax, fraction=0.03)
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    plt.close(fig)


def method_scatter(
    shapley: pd.DataFrame, scores: pd.DataFrame, path, methods=("single", "grad_norm", "atp", "gim", "coax_comp")
) -> None:
    """Per model (rows) and method (columns): each component's score against its Shapley
    value, on the model's headline game (paper A: accuracy; the others: logit_diff), with
    the Shapley SE as error bars; the first model of each group."""
    from selfrepair.groundtruth.tables import GAME_OF

    models = list(shapley.drop_duplicates("group")["model"])
    fig, axes = plt.subplots(len(models), len(methods), figsize=(2.3 * len(methods), 1.9 * len(models)), squeeze=False)
    for i, model in enumerate(models):
        s = shapley[shapley["model"] == model]
        game = GAME_OF.get(s["family"].iloc[0], s["game"].iloc[0])
        s = s[s["game"] == game].set_index("component")
        sc = scores[(scores["model"] == model) & (scores["game"] == game)]
        for j, m in enumerate(methods):
            ax = axes[i, j]
            g = sc[sc["method"] == m].set_index("component")["score"]
            x = s.loc[g.index]
            ax.errorbar(x["shapley"], g, xerr=x["se"], fmt="o", ms=2.5, lw=0.6, alpha=0.8)
            ax.axhline(0, color="grey", lw=0.4)
            ax.axvline(0, color="grey", lw=0.4)
            ax.tick_params(labelsize=5)
            if i == 0:
                ax.set_title(m, fontsize=7)
            if j == 0:
                ax.set_ylabel(f"{model}\n({game})", fontsize=6)
            if i == len(models) - 1:
                ax.set_xlabel("Shapley value", fontsize=6)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
