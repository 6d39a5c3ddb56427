"""MIB models and datasets, when present locally: same localization, else 'not run'."""

import sys

from selfrepair.core import runtime
from selfrepair.gim.localization import run_mib

smk = snakemake  # noqa: F821
device = runtime.start(smk)  # log file, numerics mode, threads; progress lines go to the log
p = smk.params
status, table, curves = run_mib(
    list(p.models),
    list(p.datasets),
    list(p.methods),
    int(p.n_eval),
    list(p.search_paths),
    p.batch_size if p.batch_size == "auto" else int(p.batch_size),
    int(p.ig_steps),
    tuple(p.fractions),
    device,
    int(p.eactp_max_edges),
    weighting=str(p.weighting),
    tie_orders=int(p.tie_orders),
    dtype=str(p.dtype),
    memory_gb=None if p.memory_gb is None else float(p.memory_gb),
    kv_inputs=str(p.kv_inputs),
    bos=str(p.bos),
)
status.to_csv(smk.output.status, index=False)
table.to_csv(smk.output.table, index=False)
curves.to_csv(smk.output.curves, index=False)
print(status.to_string(), file=sys.stderr)
