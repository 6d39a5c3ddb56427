"""The `own:` analyses' figures; each only draws a table the analysis wrote."""

from __future__ import annotations

import pandas as pd


def faithfulness(curves: pd.DataFrame, status: pd.DataFrame, path) -> None:
    """Faithfulness against the fraction of edges kept, one line per method, signed
    ranking (CPR) and absolute (CMD) side by side; an analysis that did not run shows
    its status row's reason."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from selfrepair.core.plots import save

    row = status.iloc[0]
    fig, axes = plt.subplots(1, 2, figsize=(8, 3.4), sharey=True)
    for ax, ranking in zip(axes, ("signed", "absolute")):
        sub = curves[curves["ranking"] == ranking] if "ranking" in curves else curves.iloc[:0]
        if sub.empty:
            ax.text(
                0.5, 0.5, f"{row['status']}:\n{row['reason']}"[:300], ha="center", va="center", wrap=True, fontsize=7
            )
            ax.set_axis_off()
            continue
        for method, g in sub.groupby("method", sort=False):
            ax.plot(g["fraction"], g["faithfulness"], marker="o", ms=3, label=method)
        ax.set_xscale("log")
        ax.axhline(1.0, color="grey", lw=0.5)
        ax.set_xlabel("fraction of edges")
        ax.set_title(f"{row['name']}: {'CPR (signed)' if ranking == 'signed' else 'CMD (absolute)'}", fontsize=9)
    axes[0].set_ylabel("faithfulness")
    if axes[1].get_legend_handles_labels()[0]:
        axes[1].legend(fontsize=7)
    save(fig, path)
