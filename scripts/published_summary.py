"""Rule published_summary: merge the per-paper regression tables; strict mode fails on
any "differs" (after writing nothing)."""

import pandas as pd

from selfrepair import runtime

smk = snakemake  # noqa: F821
runtime.start(smk)
table = pd.concat([pd.read_csv(f) for f in smk.input], ignore_index=True)
counts = table["status"].value_counts().to_dict()
print(f"published numbers: {counts}")
if smk.params.strict and (table["status"] == "differs").any():
    bad = table[table["status"] == "differs"][["paper", "id", "published", "reproduced"]]
    raise SystemExit(f"strict mode: {len(bad)} published numbers differ:\n{bad.to_string(index=False)}")
table.to_csv(smk.output.csv, index=False)
