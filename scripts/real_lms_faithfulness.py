"""Rule real_lms_faithfulness: paper C's faithfulness curves on each real LM and solved
task (draws gim_lm's curves.csv)."""

import pandas as pd

from selfrepair.core import plots, runtime
from selfrepair.core import real_lms_figures as F

smk = snakemake  # noqa: F821
runtime.start(smk)
runtime.check_inputs(smk)  # TableChanged on a table not as its rule wrote it
curves = pd.concat([F.read_table(p, F.CURVES_COLUMNS) for p in smk.input.curves], ignore_index=True)
F.save(plots.faithfulness_curves(curves, panel=("model", "task")), smk.output[0])
