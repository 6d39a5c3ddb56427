"""MIB-format datasets for the real LMs, made here from a seed (thin adapter)."""

from selfrepair.core import runtime
from selfrepair.tasks import mib_synth

smk = snakemake  # noqa: F821
runtime.start(smk)
p = smk.params
files = mib_synth.write(smk.output[0], list(p.tasks), int(p.n_rows), int(p.seed))
print("\n".join(str(f) for f in files))
