"""MIB models and datasets, when present locally: same localization, else 'not run'."""

import sys

sys.stderr = open(snakemake.log[0], "w")  # noqa: F821

from selfrepair.core import runtime  # noqa: E402
from selfrepair.core.models import resolve_device  # noqa: E402
from selfrepair.gim.localization import run_mib  # noqa: E402

runtime.compute_setup(snakemake)  # noqa: F821  numerics mode, threads
p = snakemake.params  # noqa: F821
status, table, curves = run_mib(
    list(p.models),
    list(p.datasets),
    list(p.methods),
    int(p.n_eval),
    list(p.search_paths),
    int(p.batch_size),
    int(p.ig_steps),
    tuple(p.fractions),
    resolve_device(p.device),
    int(p.eactp_max_edges),
)
status.to_csv(snakemake.output.status, index=False)  # noqa: F821
table.to_csv(snakemake.output.table, index=False)  # noqa: F821
curves.to_csv(snakemake.output.curves, index=False)  # noqa: F821
print(status.to_string(), file=sys.stderr)
