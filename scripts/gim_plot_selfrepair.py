"""Attention self-repair figure: occurrences per input, joint vs summed single ablations."""

import sys

sys.stderr = open(snakemake.log[0], "w")  # noqa: F821
from selfrepair.core import runtime  # noqa: E402

runtime.track(snakemake)  # noqa: F821  its outputs' records
runtime.check_inputs(snakemake)  # noqa: F821  TableChanged on a table not as its rule wrote it
import matplotlib  # noqa: E402

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

occ = pd.read_csv(snakemake.input.occurrences)  # noqa: F821
abl = pd.read_csv(snakemake.input.ablations)  # noqa: F821
fig, (a1, a2) = plt.subplots(1, 2, figsize=(9, 3.8))
for (task, model), o in occ.groupby(["task", "model"]):
    a1.hist(o.occurrences, bins=20, alpha=0.5, label=f"{task}/{model}")
a1.set_xlabel("rows with > 1 important key, per input")
a1.set_ylabel("inputs")
a1.legend(fontsize=7)
for (task, model), a in abl.groupby(["task", "model"]):
    a2.scatter(a.effect1 + a.effect2, a.effect_joint, s=6, alpha=0.5, label=f"{task}/{model}")
lim = max(1e-6, float(abl[["effect_joint"]].max().iloc[0]) if len(abl) else 1.0)
a2.plot([0, lim], [0, lim], color="grey", lw=0.7)
a2.set_xlabel("|single 1| + |single 2|")
a2.set_ylabel("|joint| (both top scores ablated)")
fig.tight_layout()
fig.savefig(snakemake.output[0], dpi=120)  # noqa: F821
