"""Rule coax_lm_pruning: paper B's sequential COAX pruning against Random, Magnitude, Wanda
and Taylor on one packaged real LM, the perplexity of each on a play (coax.lm_pruning)."""

from pathlib import Path

from selfrepair.coax import lm_pruning
from selfrepair.core import runtime

smk = snakemake  # noqa: F821
device = runtime.start(smk)
p = smk.params
tables = lm_pruning.coax_lm_pruning(
    smk.input.model, p.lm, dict(p.settings), p.top_r, p.max_rows, device, checkpoint=p.checkpoint, numerics=p.numerics
)
for name, t in tables.items():
    t.to_csv(smk.output[name], index=False)
Path(p.checkpoint).unlink(missing_ok=True)  # every step is in steps.csv now
