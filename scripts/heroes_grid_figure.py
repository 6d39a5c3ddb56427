"""Rules heroes_grid_fig_*: draw one figure of the protocol grid from its table(s)."""

import pandas as pd

from selfrepair.core import runtime
from selfrepair.heroes import grid_plots

smk = snakemake  # noqa: F821
runtime.start(smk)
runtime.check_inputs(smk)  # TableChanged on a table not as its rule wrote it
kind = smk.params.figure
t = {k: pd.read_csv(v) for k, v in smk.input.items()}
out = list(smk.output)
if kind == "rho":
    grid_plots.rho_by_cell(t["seeds"], t["rho"], out)
elif kind == "rho_vs_n":
    grid_plots.rho_vs_n(t["noise"], out)
elif kind == "superadditivity":
    grid_plots.superadditivity(t["superadditivity"], out)
else:
    raise ValueError(f"unknown grid figure {kind!r}")
