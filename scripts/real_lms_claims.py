"""Claims of papers B and C about their methods, tested on each packaged real LM: one table
(core.real_claims), beside the published one."""

import sys
from pathlib import Path

import pandas as pd

from selfrepair.coax.lm_claims import lm_claims as coax_claims
from selfrepair.core import files, real_claims, runtime
from selfrepair.gim.lm_claims import lm_claims as gim_claims

smk = snakemake  # noqa: F821
runtime.start(smk)
runtime.check_inputs(smk)  # TableChanged on a table not as its rule wrote it

read = files.read_table  # None for an absent table or a not-run placeholder


rows = []
for lm in smk.params.lms:
    if "coax" in smk.params.papers:
        folder = Path(smk.input[f"coax_{lm}"])
        names = ("ioi_scores", "ioi_truth", "ioi_prompts", "induction_sequences")
        tables = {n: t for n in names if (t := read(folder / f"{n}.csv")) is not None}
        if f"coax_pruning_{lm}" in smk.input.keys():  # where rule coax_lm_pruning runs
            tables["pruning_sequences"] = read(smk.input[f"coax_pruning_{lm}"])
        rows += coax_claims(lm, tables, smk.params.backup_share, smk.params.pruning_headline)
    if "gim" in smk.params.papers:
        tasks, contrasts = read(smk.input[f"gim_tasks_{lm}"]), read(smk.input[f"gim_contrasts_{lm}"])
        rows += gim_claims(lm, tasks, contrasts if contrasts is not None else pd.DataFrame(),
                           read(smk.input[f"gim_fa_{lm}"]))  # fmt: skip
table = real_claims.table(rows)
table.to_csv(smk.output.csv, index=False)
print(real_claims.counts(table).to_string(), file=sys.stderr)
