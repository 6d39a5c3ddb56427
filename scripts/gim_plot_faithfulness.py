"""Faithfulness curves of every method (only draws what curves.csv holds)."""

import sys

sys.stderr = open(snakemake.log[0], "w")  # noqa: F821
from selfrepair.core import runtime  # noqa: E402

runtime.track(snakemake)  # noqa: F821  its outputs' records
runtime.check_inputs(snakemake)  # noqa: F821  TableChanged on a table not as its rule wrote it
import pandas as pd  # noqa: E402

from selfrepair.core import plots  # noqa: E402

plots.faithfulness_curves(pd.read_csv(snakemake.input.curves)).savefig(snakemake.output[0], dpi=120)  # noqa: F821
