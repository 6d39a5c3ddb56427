"""Feature attribution on the classification toy task (thin adapter)."""

import sys

sys.stderr = open(snakemake.log[0], "w")  # noqa: F821

from selfrepair.core import runtime  # noqa: E402
from selfrepair.core.models import load_bridge, resolve_device  # noqa: E402
from selfrepair.gim import feature_attribution as fa  # noqa: E402
from selfrepair.tasks.classify import Classify  # noqa: E402

runtime.compute_setup(snakemake)  # noqa: F821  numerics mode, threads
p = snakemake.params  # noqa: F821
task = Classify()
bridge = load_bridge(snakemake.input.model, resolve_device(p.device))  # noqa: F821
data, truth = task.sample_with_truth(int(p.n_examples), seed=int(p.data_seed))
df = fa.evaluate(bridge, data, truth, task.id["<pad>"], tuple(p.methods), int(p.ig_steps))
df.assign(task="classify", model=p.model_name).to_csv(snakemake.output[0], index=False)  # noqa: F821
print(df.groupby("method").mean(numeric_only=True), file=sys.stderr)
