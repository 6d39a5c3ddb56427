"""Rule own_faithfulness_figure: an `own:` entry's faithfulness curves (draws curves.csv)."""

import pandas as pd

from selfrepair.core import runtime
from selfrepair.own.plots import faithfulness

smk = snakemake  # noqa: F821
runtime.start(smk)
runtime.check_inputs(smk)  # TableChanged on a table not as its rule wrote it
curves = pd.read_csv(smk.input.curves) if open(smk.input.curves).read().strip() else pd.DataFrame()
faithfulness(curves, pd.read_csv(smk.input.status, keep_default_na=False), smk.output[0])
