"""Rule coax_synthetic: paper B's synthetic benchmark (planted backups, no model)."""

from selfrepair.coax import score as coax
from selfrepair.core import runtime

smk = snakemake  # noqa: F821
runtime.start(smk)
p = dict(smk.params.synthetic)
table = coax.synthetic_benchmark(
    trials=p["trials"], seed=p["seed"], r=p["r"], n_backup=p["n_backup"], n_inert=p["n_inert"]
)
table.to_csv(smk.output.csv, index=False)
