"""The ground truth on one packaged real LM: Shapley values of its top components (and the
rest as one player) on the IOI pairs paper C's real-LM rules score, every method against them."""

from selfrepair.core import runtime
from selfrepair.groundtruth.lms import run_lm

smk = snakemake  # noqa: F821
device = runtime.start(smk)
p = smk.params
tables = run_lm(smk.input.model, smk.input.data, p.name, dict(p.lm), dict(p.settings), int(p.top_k), device)
for name, path in smk.output.items():
    tables[name].to_csv(path, index=False)
