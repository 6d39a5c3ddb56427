"""Rule own_status: every `own:` analysis's status row in one table."""

import sys

import pandas as pd

from selfrepair.core import runtime

smk = snakemake  # noqa: F821
runtime.start(smk)
rows = [pd.read_csv(f, keep_default_na=False) for f in smk.input.status]
table = pd.concat(rows, ignore_index=True)
table.to_csv(smk.output[0], index=False)
print(table.to_string(), file=sys.stderr)
