"""Rule real_lms_forest: the claims' forest plot (draws results/published/real_lms.csv, the
claims table of the scale this run was made at)."""

from selfrepair.core import real_lms_figures as F
from selfrepair.core import runtime

smk = snakemake  # noqa: F821
runtime.start(smk)
runtime.check_inputs(smk)  # TableChanged on a table not as its rule wrote it
tables = {smk.params.scale: F.read_table(smk.input.claims, F.CLAIMS_COLUMNS)}
F.save(F.forest(tables), smk.output[0])
