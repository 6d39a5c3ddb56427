"""Rule coax_ioi_tables: concatenate the toy-IOI runs; discovery summary with paired tests."""

import pandas as pd

from selfrepair.coax import score as coax
from selfrepair.core import runtime

smk = snakemake  # noqa: F821
runtime.start(smk)
i = smk.input
cat = {
    k: pd.concat([pd.read_csv(f) for f in i[k]], ignore_index=True) for k in ("discovery", "wake", "freeze", "knockout")
}
coax.ioi_summary(cat["discovery"]).to_csv(smk.output.summary, index=False)
for k, t in cat.items():
    t.to_csv(smk.output[k], index=False)
