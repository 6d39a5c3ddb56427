"""Rule coax_lm: paper B on one packaged real LM (IOI with name movers and backups by
conditional ablation, COAX and its baselines, wake-up, freezing, knockout; induction)."""

from pathlib import Path

from selfrepair.coax import lms
from selfrepair.core import runtime

smk = snakemake  # noqa: F821
device = runtime.start(smk)
p = smk.params
Path(smk.output.tables).mkdir(parents=True, exist_ok=True)
status = lms.coax_lm(
    smk.input.model, p.lm, dict(p.settings), dict(p.ioi), dict(p.induction), p.protocol, smk.output.tables, device
)
status.to_csv(smk.output.status, index=False)
