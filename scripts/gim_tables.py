"""Circuit-localization table (CPR, CMD per task, model, method) and the curves (thin adapter)."""
import sys

sys.stderr = open(snakemake.log[0], "w")  # noqa: F821
import pandas as pd  # noqa: E402

inp, out = snakemake.input, snakemake.output  # noqa: F821
table = pd.concat([pd.read_csv(f) for f in inp.summaries])
table = table[["task", "model", "method", "n_edges", "cpr", "cmd", "m_full", "m_empty"]]
table.to_csv(out.table, index=False)
pd.concat([pd.read_csv(f) for f in inp.curves]).to_csv(out.curves, index=False)
print(table.to_string(), file=sys.stderr)
