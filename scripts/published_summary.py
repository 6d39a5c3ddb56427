"""Rule published_summary: merge the per-paper regression tables; strict mode fails on
any "differs" (after writing nothing). "fragile" claims (the verdict changes within the
measurement's CI) never fail strict mode but are listed."""

import logging

import pandas as pd

from selfrepair.core import published, runtime

smk = snakemake  # noqa: F821
runtime.start(smk)
runtime.check_inputs(smk)  # TableChanged on a table not as its rule wrote it
table = pd.concat([pd.read_csv(f) for f in smk.input], ignore_index=True)
table["numerics"] = smk.params.numerics  # the run's numerics mode, beside every number
logging.info(published.summary_report(table, smk.params.strict))  # to the log, listing fragile claims
table.to_csv(smk.output.csv, index=False)
