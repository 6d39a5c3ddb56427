"""Paper C on one real LM: the accuracy gate, localization with intervals over pairs,
feature attribution (thin adapter)."""

import resource
import sys

from selfrepair.core import runtime
from selfrepair.gim.lm_run import run_lm, settings

smk = snakemake  # noqa: F821
device = runtime.start(smk)  # log file, numerics mode, threads; progress lines go to the log
p = smk.params
s = settings(dict(p.lms), dict(p.gim), str(p.scale))
tables = run_lm(smk.input.model, str(p.name), smk.input.data, s, device)
for name, table in tables.items():
    table.to_csv(getattr(smk.output, name), index=False)
print(tables["status"].to_string(), file=sys.stderr)
print(f"peak resident memory {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6:.2f} GB", file=sys.stderr)
