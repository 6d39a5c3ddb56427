"""Rule groundtruth_figures: the agreement heat map and the per-model scatter."""

import pandas as pd

from selfrepair.core import runtime
from selfrepair.groundtruth import plots

smk = snakemake  # noqa: F821
runtime.start(smk)
runtime.check_inputs(smk)  # TableChanged on a table not as its rule wrote it
plots.agreement_heatmap(pd.read_csv(smk.input.agreement), smk.output.agreement)
plots.method_scatter(pd.read_csv(smk.input.shapley), pd.read_csv(smk.input.scores), smk.output.scatter)
