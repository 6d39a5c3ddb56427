"""Rule coax_induction_table: COAX / random drop ratios per model and k."""

import pandas as pd

from selfrepair.coax.induction_experiment import ratio_table
from selfrepair.core import runtime

smk = snakemake  # noqa: F821
runtime.start(smk)
sets = {m: pd.read_csv(f) for m, f in zip(smk.params.models, smk.input.sets)}
ratio_table(sets).to_csv(smk.output.csv, index=False)
