"""Faithfulness curves of every method (only draws what curves.csv holds)."""

import sys

sys.stderr = open(snakemake.log[0], "w")  # noqa: F821
from selfrepair.core import runtime  # noqa: E402

runtime.track(snakemake)  # noqa: F821  its outputs' records
runtime.check_inputs(snakemake)  # noqa: F821  TableChanged on a table not as its rule wrote it
import matplotlib  # noqa: E402

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

df = pd.read_csv(snakemake.input.curves)  # noqa: F821
pairs = df[["task", "model"]].drop_duplicates().values.tolist()
fig, axes = plt.subplots(2, len(pairs), figsize=(3.6 * len(pairs), 6.4), squeeze=False, sharey="row")
for col, (task, model) in enumerate(pairs):
    for row, ranking in enumerate(("signed", "absolute")):
        ax = axes[row, col]
        sub = df[(df.task == task) & (df.model == model) & (df.ranking == ranking)]
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
        ax.set_title(f"{task} / {model}{n_seeds}\n{'CPR (signed)' if row == 0 else 'CMD (absolute)'}", fontsize=9)
        ax.set_xlabel("fraction of edges")
        if col == 0:
            ax.set_ylabel("faithfulness")
axes[0, -1].legend(fontsize=7)
fig.tight_layout()
fig.savefig(snakemake.output[0], dpi=120)  # noqa: F821
