"""Circuit-localization tables: CPR, CMD per task, model, seed and method; their mean and
t-interval over each task's models with the paired differences (GIM - EAP / EAP-IG, RelP and
EAP-GP - GIM); IFR's range over MIB's tie orders; the curves
(thin adapter)."""

import sys

sys.stderr = open(snakemake.log[0], "w")  # noqa: F821
from selfrepair.core import runtime  # noqa: E402

runtime.track(snakemake)  # noqa: F821  its outputs' records
import pandas as pd  # noqa: E402

from selfrepair.gim.localization import TIE_COLUMNS, localization_summary  # noqa: E402

inp, out = snakemake.input, snakemake.output  # noqa: F821
table = pd.concat([pd.read_csv(f) for f in inp.summaries])
table = table.reindex(
    columns=["task", "model", "seed", "method", "n_edges", "cpr", "cmd", "m_full", "m_empty", *TIE_COLUMNS]
)
table.to_csv(out.table, index=False)
summary = localization_summary(table)
summary.to_csv(out.summary, index=False)
pd.concat([pd.read_csv(f) for f in inp.curves]).to_csv(out.curves, index=False)
print(table.to_string(), file=sys.stderr)
print(summary.to_string(), file=sys.stderr)
