"""Rules heroes_fig_*: draw one paper-A figure from its table(s)."""

import pandas as pd

from selfrepair.core import plots, runtime

smk = snakemake  # noqa: F821
runtime.start(smk)
runtime.check_inputs(smk)  # TableChanged on a table not as its rule wrote it
kind = smk.params.figure
tables = {k: pd.read_csv(v) for k, v in smk.input.items()}
out = list(smk.output)
if kind == "g_vs_c":
    plots.g_vs_c(tables["components"], tables["rho"], out)
elif kind == "waterfall":
    plots.waterfall(tables["components"], out, smk.params.threshold)
elif kind == "roles_by_layer":
    plots.roles_by_layer(tables["roles_by_layer"], out)
elif kind == "role_stability":
    plots.role_stability(tables["role_stability"], out)
elif kind == "redundancy":
    plots.redundancy(tables["redundancy_summary"], out)
elif kind == "pruning":
    plots.pruning(tables["pruning"], out)
elif kind == "attention":
    plots.attention(tables["attention"], tables["patterns"], out)
else:
    raise ValueError(f"unknown figure {kind!r}")
