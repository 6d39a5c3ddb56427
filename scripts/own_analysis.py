"""Rules own_{edges,shapley,coax,g_vs_c}: one analysis of one `own:` entry (thin adapter
over selfrepair.own.run); what cannot run gives a "not run" status row, not a failure."""

from selfrepair.core import runtime
from selfrepair.own.run import run_analysis

smk = snakemake  # noqa: F821
device = runtime.start(smk)
run_analysis(str(smk.params.kind), dict(smk.params.settings), dict(smk.output.items()), device)
