"""Rule coax_real: paper B's rules on GPT-2 and the papers' models, when their weights are local.

Absent weights give a 'not run: weights not found at ...' status row, not a failure.
"""

from pathlib import Path

from selfrepair.coax import claims, real_models
from selfrepair.core import runtime

smk = snakemake  # noqa: F821
device = runtime.start(smk)
p = smk.params
Path(smk.output.tables).mkdir(parents=True, exist_ok=True)
status = real_models.run_real_models(
    dict(p.real), dict(p.ioi), dict(p.induction), p.protocol, p.top_r, smk.output.tables, device, p.max_rows
)
status = claims.status_with_claims(status)  # the claim ids each model x experiment bears on
status.to_csv(smk.output.status, index=False)
